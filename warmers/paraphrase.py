"""Paraphrase clusters: one representative per group of queries the semantic cache serves alike.

A cluster is what one warmed entry serves: the semantic cache answers a request from an entry
when their cosine is >= the tenant's threshold and their context and params hashes are equal.
So clustering mirrors that rule exactly:
1. queries are split by scope (canonical params + retrieved docs): across scopes nothing is shared;
2. inside a scope, in order of value (most valuable first), the best unclaimed query becomes a
   representative and claims every unclaimed query within cosine >= threshold of it
   (scikit-learn's radius neighbours, cosine metric): every member is one the cache would serve
   from the representative, not merely a neighbour of a neighbour as single linkage allows.
The threshold is the tenant's semantic threshold unless the caller passes a looser one.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
from sklearn.neighbors import NearestNeighbors

from caches.embedders import CachedEmbedder, Embedder

Vectors = npt.NDArray[np.float32]


@dataclass(frozen=True)
class Cluster:
    """Indices into the caller's lists; `members[0]` is the representative."""

    members: tuple[int, ...]

    @property
    def rep(self) -> int:
        return self.members[0]


def cluster_by_radius(
    vectors: Vectors,
    values: Sequence[float],
    threshold: float,
    scopes: Sequence[Hashable] | None = None,
) -> list[Cluster]:
    """Clusters in order of their representative's value (see the module docstring)."""
    n = len(values)
    if vectors.shape[0] != n or (scopes is not None and len(scopes) != n):
        raise ValueError("vectors, values and scopes must have one row per query")
    if not 0.0 < threshold <= 1.0:
        raise ValueError(f"threshold must lie in (0, 1], got {threshold}")
    by_scope: dict[Hashable, list[int]] = {}
    for i in range(n):
        by_scope.setdefault(scopes[i] if scopes is not None else None, []).append(i)
    out: list[Cluster] = []
    for idx in by_scope.values():
        out += _cluster_scope(vectors, values, threshold, idx)
    out.sort(key=lambda c: (-values[c.rep], c.rep))
    return out


def _cluster_scope(
    vectors: Vectors, values: Sequence[float], threshold: float, idx: list[int]
) -> list[Cluster]:
    order = sorted(idx, key=lambda i: (-values[i], i))
    if len(order) == 1:
        return [Cluster((order[0],))]
    v = vectors[order]
    # cosine distance = 1 - cosine; a hair of slack so a pair exactly at the threshold joins,
    # as the cache's ">=" would serve it.
    nn = NearestNeighbors(radius=1.0 - threshold + 1e-6, metric="cosine", algorithm="brute")
    neighbours = nn.fit(v).radius_neighbors(v, return_distance=False)
    claimed = np.zeros(len(order), dtype=bool)
    out: list[Cluster] = []
    for pos in range(len(order)):  # value order: the most valuable unclaimed query leads
        if claimed[pos]:
            continue
        mine = [int(j) for j in sorted(neighbours[pos]) if not claimed[j] and j != pos]
        claimed[pos] = True
        claimed[mine] = True
        out.append(Cluster((order[pos], *(order[j] for j in mine))))
    return out


class TextVectors:
    """Embeds through a CachedEmbedder (Redis, per tenant) or a bare Embedder, with an in-process
    memo: the scheduler re-plans the same few thousand hot queries every run, and an embedding
    costs ~10-20 ms of CPU on this box."""

    def __init__(self, embedder: Embedder | CachedEmbedder, memo_max: int = 200_000) -> None:
        self.embedder = embedder
        self._memo: dict[tuple[str, str], Vectors] = {}
        self._memo_max = memo_max

    def embed(self, tenant: str, texts: Sequence[str]) -> Vectors:
        todo = sorted({t for t in texts if (tenant, t) not in self._memo})
        if todo and len(self._memo) + len(todo) > self._memo_max:
            self._memo.clear()
            todo = sorted(set(texts))
        if todo:
            e = self.embedder
            fresh = e.embed(tenant, todo) if isinstance(e, CachedEmbedder) else e.embed(todo)
            for t, vec in zip(todo, fresh, strict=True):
                self._memo[tenant, t] = vec
        dim = self.embedder.dim
        if not texts:
            return np.empty((0, dim), dtype=np.float32)
        return np.stack([self._memo[tenant, t] for t in texts]).astype(np.float32)
