"""Each unique prompt embedded once; each key's cosine neighbours inside its must-filter group.

Brute-force cosine by blocks of matrix products (exact, no HNSW recall loss), only within a
group: semantic candidates must share tenant, model id+version, template version, context hash
and params (caches/semantic's must-filter), so no neighbour ever crosses a tenant. The 72k-row
sample has 30.6k keys (24.2k distinct prompts to embed) in 153 groups, the largest 8.0k keys:
an 8k x 8k product is ~25 GFLOP, seconds on 2 cores; the embedding is what takes the time.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from caches.embedders import Embedder, Vectors
from caches.embedding_cache import CachedEmbedder

# Neighbours kept per key, best first. The simulation serves the best *live* neighbour, so a
# key whose 128 nearest are all expired counts a miss even if a 129th is live: a tiny
# undercount, reported as `capped_keys`, traded for memory bounded at 128 x keys.
NEIGHBOUR_CAP = 128
# Rows per matrix product: 512 x 30k keys x 4 B = 61 MB per block at most.
BLOCK_ROWS = 512
# Prompts per embedder call: a progress tick every ~1-3 s on 2 cores.
EMBED_CHUNK = 256

# The embedding cache's scope for analyze: texts are embedded once for all tenants, so under a
# name of their own, which no tenant can take (a brace is banned in tenant ids).
ANALYZE_SCOPE = "{analyze}"

Progress = Callable[[int, int], None]
_NO_IDS = np.empty(0, dtype=np.int64)
_NO_SIMS = np.empty(0, dtype=np.float32)


def embed_unique(texts: Sequence[str], embedder: Embedder, on_progress: Progress) -> Vectors:
    """Vectors of `texts` (row i for texts[i]); each distinct text goes to the embedder once."""
    unique = sorted(set(texts), key=len)  # similar lengths batch with little padding
    vecs = np.empty((len(unique), embedder.dim), dtype=np.float32)
    on_progress(0, len(unique))
    for start in range(0, len(unique), EMBED_CHUNK):
        chunk = unique[start : start + EMBED_CHUNK]
        vecs[start : start + len(chunk)] = embedder.embed(chunk)
        on_progress(start + len(chunk), len(unique))
    where = {t: i for i, t in enumerate(unique)}
    out: Vectors = vecs[np.fromiter((where[t] for t in texts), dtype=np.int64, count=len(texts))]
    return out


class ScopedEmbedder(Embedder):
    """The embedding cache as a plain Embedder, every text under ANALYZE_SCOPE."""

    def __init__(self, cached: CachedEmbedder) -> None:
        self.cached, self.id, self.dim = cached, cached.id, cached.dim

    def embed(self, texts: Sequence[str]) -> Vectors:
        return self.cached.embed(ANALYZE_SCOPE, texts)


@dataclass(frozen=True)
class Neighbours:
    """Invariant: ids[k] are keys of k's group other than k, sims[k] their cosines, descending,
    all >= the floor the graph was built with."""

    ids: list[npt.NDArray[np.int64]]
    sims: list[npt.NDArray[np.float32]]
    capped_keys: int

    def candidates(self, threshold: float) -> list[list[int]]:
        """Per key, the neighbours at or above `threshold`, best first (plain lists: the
        simulation loop walks them in Python, where list indexing beats numpy scalars)."""
        out: list[list[int]] = []
        for ids, sims in zip(self.ids, self.sims, strict=True):
            n = int(np.searchsorted(-sims, -threshold, side="right")) if len(sims) else 0
            out.append(ids[:n].tolist())
        return out


def build_neighbours(key_group: npt.NDArray[np.int64], vecs: Vectors, floor: float) -> Neighbours:
    """Neighbours of every key at cosine >= floor, within its group (vectors are unit length)."""
    ids: list[npt.NDArray[np.int64]] = [_NO_IDS] * len(key_group)
    sims: list[npt.NDArray[np.float32]] = [_NO_SIMS] * len(key_group)
    capped = 0
    order = np.argsort(key_group, kind="stable")
    starts = np.flatnonzero(np.diff(key_group[order])) + 1
    for members in np.split(order, starts):
        if len(members) > 1:
            capped += _group(members, vecs[members], floor, ids, sims)
    return Neighbours(ids, sims, capped)


def _group(
    members: npt.NDArray[np.int64],
    vecs: Vectors,
    floor: float,
    ids: list[npt.NDArray[np.int64]],
    sims: list[npt.NDArray[np.float32]],
) -> int:
    capped = 0
    for b in range(0, len(members), BLOCK_ROWS):
        block = vecs[b : b + BLOCK_ROWS] @ vecs.T
        rows = np.arange(len(block))
        block[rows, rows + b] = -1.0  # a key is not its own neighbour
        hit_rows, hit_cols = np.nonzero(block >= floor)
        bounds = [*np.searchsorted(hit_rows, rows, side="left").tolist(), len(hit_rows)]
        for r in np.unique(hit_rows).tolist():
            cols = hit_cols[bounds[r] : bounds[r + 1]]
            scores = block[r, cols]
            if len(cols) > NEIGHBOUR_CAP:
                capped += 1
                top = np.argpartition(-scores, NEIGHBOUR_CAP)[:NEIGHBOUR_CAP]
                cols, scores = cols[top], scores[top]
            best = np.argsort(-scores, kind="stable")
            ids[int(members[b + r])] = members[cols[best]]
            sims[int(members[b + r])] = scores[best].astype(np.float32)
    return capped
