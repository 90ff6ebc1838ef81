"""Coverage at the serving threshold: which requests a set of warmed prompts would serve, and
the best any K prompts could do (benchmarks bench_hot_set and bench_warm_vs_naive)."""

from __future__ import annotations

from typing import Protocol

import numpy as np
from scipy import sparse

SERVE = 0.92  # the static matcher's default threshold: what one warmed entry serves alone


class Embeds(Protocol):
    dim: int

    def embed(self, texts: list[str]) -> np.ndarray: ...


class Scorer:
    """Which of a window's requests a set of warmed prompts would serve (exact, or >= SERVE)."""

    def __init__(self, emb: Embeds) -> None:
        self.emb = emb

    def vecs(self, texts: list[str]) -> np.ndarray:
        return self.emb.embed(texts) if texts else np.zeros((0, self.emb.dim), np.float32)

    def served(self, asked: list[str], warmed: list[str]) -> int:
        if not asked or not warmed:
            return 0
        a, w = self.vecs(asked), self.vecs(sorted(set(warmed)))
        return int(((a @ w.T).max(axis=1) >= SERVE - 1e-6).sum() + 0)

    def oracle(self, asked: list[str], k: int, candidates: list[str] | None = None) -> int:
        """Greedy maximum coverage of the window's requests by k prompts: of the window's own
        (it sees the future, new texts included), or of `candidates` (what a warmer could
        send: the prompts it has seen logged, chosen knowing which the window asks)."""
        return self._greedy(asked, k, candidates)[1]

    def pick(self, asked: list[str], k: int, candidates: list[str]) -> list[str]:
        """The k candidates oracle() would choose to cover `asked`."""
        return self._greedy(asked, k, candidates)[0]

    def _greedy(
        self, asked: list[str], k: int, candidates: list[str] | None
    ) -> tuple[list[str], int]:
        uniq, counts = np.unique(np.asarray(asked, dtype=object), return_counts=True)
        if not len(uniq):
            return [], 0
        v = self.vecs(uniq.tolist())
        names = uniq.tolist() if candidates is None else sorted(set(candidates))
        pool = v if candidates is None else self.vecs(names)
        # candidates x asked texts, sparse: at 0.92 a text is near few others
        near = sparse.csr_matrix((pool @ v.T) >= SERVE - 1e-6, dtype=np.float64)
        left = counts.astype(np.float64)
        got, chosen = 0.0, []
        for _ in range(min(k, pool.shape[0])):
            gain = near @ left
            best = int(np.argmax(gain))
            if gain[best] <= 0:
                break
            got += gain[best]
            chosen.append(names[best])
            left[near[best].indices] = 0.0
        return chosen, int(got)
