"""Paraphrase clusters: the representatives whose warmed entries serve the most expected traffic.

A representative serves what the semantic cache would answer from its entry: every query with
cosine >= the threshold and equal context and params hashes. Choosing which to warm is maximum
coverage (the value served, not the count of entries), solved greedily as usual for it (within
1 - 1/e of the best set, Nemhauser et al. 1978):
1. queries are split by scope (canonical params + retrieved docs): across scopes nothing is shared;
2. each query's neighbourhood is every query of its scope within cosine >= threshold
   (one matrix product of unit vectors per chunk of rows), itself included;
3. repeatedly, the query whose neighbourhood holds the most value not yet served becomes the next
   representative, and its cluster is that unserved value; until nothing is left unserved.
So a representative is the centre of its paraphrases, not merely the most asked phrasing (which
leaves about twice as many second entries for one intent in a hot set: bench_hot_set, see
docs/benchmarks.md, "The hot set"), and no value is counted twice: a member belongs to the
first representative that serves it.
The threshold is the tenant's semantic threshold unless the caller passes a looser one.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from caches.embedders import Embedder, unit
from caches.embedding_cache import CachedEmbedder

Vectors = npt.NDArray[np.float32]


@dataclass(frozen=True)
class Cluster:
    """Indices into the caller's lists: the representative and the queries it serves first
    (the representative itself among them unless an earlier representative serves it)."""

    rep: int
    members: tuple[int, ...]


def cover_greedy(
    vectors: Vectors,
    values: Sequence[float],
    threshold: float,
    scopes: Sequence[Hashable] | None = None,
    limit: int | None = None,
) -> list[Cluster]:
    """Representatives in the greedy order (see the module docstring), at most `limit`; the
    value of a cluster's members never grows down the list. Ties go to the lower index."""
    n = len(values)
    if vectors.shape[0] != n or (scopes is not None and len(scopes) != n):
        raise ValueError("vectors, values and scopes must have one row per query")
    if not 0.0 < threshold <= 1.0:
        raise ValueError(f"threshold must lie in (0, 1], got {threshold}")
    if any(v < 0 for v in values):
        raise ValueError("values must not be negative")
    if n == 0:
        return []
    near = _neighbourhoods(vectors, threshold, scopes)
    value = np.asarray(values, dtype=np.float64)
    gain = np.array([value[nb].sum() for nb in near])  # unserved value each query would serve
    served = np.zeros(n, dtype=bool)
    out: list[Cluster] = []
    while len(out) < (n if limit is None else limit):
        rep = int(np.argmax(gain))  # the first maximum: the lower index wins a tie
        if gain[rep] <= 0.0:
            break
        new = near[rep][~served[near[rep]]]
        gain[rep] = -np.inf  # chosen, or serves nothing new (a rounding residue): never again
        if not len(new):
            continue
        served[new] = True
        # the newly served value no longer counts for anyone who would serve it
        # (neighbourhoods are symmetric: who serves i = i's own neighbourhood)
        np.subtract.at(gain, np.concatenate([near[i] for i in new]),
                       np.repeat(value[new], [len(near[i]) for i in new]))  # fmt: skip
        rest = [int(i) for i in new if i != rep]
        out.append(Cluster(rep, (rep, *rest) if len(rest) < len(new) else tuple(rest)))
    return out


def _neighbourhoods(
    vectors: Vectors, threshold: float, scopes: Sequence[Hashable] | None
) -> list[npt.NDArray[np.intp]]:
    """For each query, the indices within cosine >= threshold of it in its own scope."""
    n = vectors.shape[0]
    by_scope: dict[Hashable, list[int]] = {}
    for i in range(n):
        by_scope.setdefault(scopes[i] if scopes is not None else None, []).append(i)
    near: list[npt.NDArray[np.intp]] = [np.empty(0, dtype=np.intp)] * n
    for idx in by_scope.values():
        members = np.asarray(idx, dtype=np.intp)
        if len(idx) == 1:
            near[idx[0]] = members
            continue
        # Cosine by one matrix product per chunk of rows (scikit-learn's radius neighbours
        # cost ~8 ms of argument checks a call, and a plan has a scope per set of documents:
        # a quarter of the demo's planning time). A hair of slack so a pair exactly at the threshold joins,
        # as the cache's ">=" would serve it.
        v = unit(vectors[idx])  # a zero row is similar to nothing, not even itself
        step = max(1, _CHUNK_CELLS // len(idx))
        for lo in range(0, len(idx), step):
            sims = v[lo : lo + step] @ v.T
            for pos, row in enumerate(sims, start=lo):
                near[idx[pos]] = members[np.flatnonzero(row >= threshold - 1e-6)]
    return near


_CHUNK_CELLS = 4_000_000  # similarities held at once (16 MB of float32)


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
