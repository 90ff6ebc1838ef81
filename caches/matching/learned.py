"""Matchers learned from answer agreement: what the backend answered to prompts near the query.

An `AnswerBank` holds (prompt vector, answer) pairs. Today only the evaluation harness
(stoker/semantic_eval.py) fills it, from the simulated backend's answers to the stream's
earlier prompts; no warmer or gateway feeds it yet, so production serves the static threshold.
Two answers are the same when their normalised text is (lower case, punctuation and extra
spaces dropped). Nothing here reads an intent or a label: only vectors, prompts and backend
answers. A real backend's answers depend on what a question means, which is exactly the
information a cosine lacks.

Two ways to use the bank, both measured by `stoker eval-semantic`:
- `AnswerAgreement` (the default): the k nearest banked prompts of the query vote on its answer,
  those of the candidate on the candidate's; a candidate over the floor is served only when both
  votes are confident (>= `votes` of k) and name the same answer. Out-of-scope queries rarely get
  a confident vote, so they rarely hit.
- `EntryRadius`: a per-entry threshold, the cosine of the nearest banked prompt whose answer
  differs from the entry's voted answer (the radius inside which the backend agreed).
"""

from __future__ import annotations

import hashlib
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from caches.matching.base import Accepted, Candidate, Matcher, Query, Vector

_PUNCT = re.compile(r"[^\w\s]")
_SPACE = re.compile(r"\s+")


def answer_id(answer: str) -> str:
    """Equivalence class of an answer: its normalised text, hashed (16 hex chars)."""
    norm = _SPACE.sub(" ", _PUNCT.sub(" ", answer.lower())).strip()
    return hashlib.sha256(norm.encode()).hexdigest()[:16]


@dataclass(frozen=True)
class Vote:
    answer: str  # answer id the neighbours agree on most
    count: int  # how many of the k nearest gave it
    nearest: float  # cosine of the nearest banked prompt
    other: float  # cosine of the nearest banked prompt with another answer (-1: none in top k)


class AnswerBank:
    """Prompt vectors with the answer id the backend gave; brute-force top-k in numpy (15k
    prompts x 384 dims is ~2 ms per query batch here; a Qdrant collection past ~100k)."""

    def __init__(self, dim: int, k: int = 7) -> None:
        self.dim = dim
        self.k = k
        self._vecs = np.zeros((0, dim), dtype=np.float32)
        self._answers: list[str] = []

    def __len__(self) -> int:
        return len(self._answers)

    def observe(self, vectors: Vector, answers: Sequence[str]) -> None:
        """Record what the backend answered (`answers` are raw texts) to prompts with these vectors."""
        if vectors.shape != (len(answers), self.dim):
            raise ValueError(f"want {len(answers)} vectors of dim {self.dim}, got {vectors.shape}")
        self._vecs = np.vstack([self._vecs, vectors.astype(np.float32)])
        self._answers.extend(answer_id(a) for a in answers)

    def votes(self, vectors: Vector, k: int | None = None) -> list[Vote]:
        """One vote per row of `vectors` (unit vectors: cosine = dot product)."""
        k = min(k or self.k, len(self._answers))
        if k == 0:
            return [Vote("", 0, -1.0, -1.0) for _ in range(len(vectors))]
        sims = vectors @ self._vecs.T
        top = np.argpartition(-sims, k - 1, axis=1)[:, :k]
        out = []
        for row, idx in zip(sims, top, strict=True):
            idx = idx[np.argsort(-row[idx])]
            answers = [self._answers[j] for j in idx]
            best, count = Counter(answers).most_common(1)[0]
            others = [float(row[j]) for j, a in zip(idx, answers, strict=True) if a != best]
            out.append(Vote(best, count, float(row[idx[0]]), others[0] if others else -1.0))
        return out


class AnswerAgreement(Matcher):
    """Serve a candidate over `floor` when the bank's votes for query and candidate agree."""

    needs_vectors = True

    def __init__(self, bank: AnswerBank, floor: float = 0.78, votes: int = 5, limit: int = 5):
        super().__init__()
        if not 1 <= votes <= bank.k:
            raise ValueError(f"votes must lie in [1, {bank.k}]")
        self.bank = bank
        self.floor = floor
        self.min_votes = votes
        self.limit = limit
        self.name = f"answers-agree>={votes}/{bank.k}"

    def floor_for(self, q: Query) -> float:
        return self.floor

    def choose(self, q: Query, cands: Sequence[Candidate]) -> Accepted | None:
        if not cands:
            return None
        vecs = np.vstack([q.vector, *[_vector(c) for c in cands]])
        qv, *cv = self.bank.votes(vecs)
        if qv.count < self.min_votes:
            self.stats.verified("unsure")
            return None
        for i, v in enumerate(cv):
            if v.count >= self.min_votes and v.answer == qv.answer:
                self.stats.verified("agree")
                return Accepted(i, f"{self.name},cos>={self.floor:.2f}")
            self.stats.verified("disagree" if v.count >= self.min_votes else "unsure")
        return None


class EntryRadius(Matcher):
    """Per-entry learned threshold: serve a candidate when the query lies closer to it than the
    nearest banked prompt that got another answer (plus `margin`), never under `floor`."""

    needs_vectors = True

    def __init__(
        self, bank: AnswerBank, floor: float = 0.85, margin: float = 0.0, cap: float = 0.98
    ) -> None:
        super().__init__()
        self.bank = bank
        self.floor = floor
        self.margin = margin
        self.cap = cap
        self.limit = 5
        self.name = "entry-radius"

    def floor_for(self, q: Query) -> float:
        return self.floor

    def choose(self, q: Query, cands: Sequence[Candidate]) -> Accepted | None:
        if not cands:
            return None
        votes = self.bank.votes(np.vstack([_vector(c) for c in cands]), k=10)
        for i, (c, v) in enumerate(zip(cands, votes, strict=True)):
            radius = v.other if v.other >= 0 else self.floor
            if c.score >= min(max(radius + self.margin, self.floor), self.cap):
                self.stats.verified("inside")
                return Accepted(i, self.name)  # the radius itself varies per entry: not a rule name
            self.stats.verified("outside")
        return None


def _vector(c: Candidate) -> Vector:
    if c.vector is None:
        raise ValueError(f"candidate {c.entry_key} came without its vector")
    return c.vector
