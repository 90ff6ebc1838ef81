"""A TTL cache replayed over the log in time order, and the log's duplicate structure.

The simulated cache follows caches/client.py's read path:
1. a bypassed request (temperature > 0, no-cache) is a miss and writes nothing;
2. a live exact entry for the request's key is an exact hit;
3. else the best-scoring live entry among the key's neighbours at or above the threshold (same
   must-filter group) is a semantic hit; it writes nothing, as a served hit does;
4. else a miss: the answer is stored for the key, live until ts + TTL.
Entries are keyed by key id, so an expired entry is simply overwritten by the next miss.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from audits.whatif.keyed_log import KeyedLog
from audits.whatif.neighbours import Neighbours

MISS, EXACT, SEMANTIC, BYPASS = 0, 1, 2, 3


@dataclass(frozen=True)
class Replayed:
    outcome: npt.NDArray[np.int8]  # MISS / EXACT / SEMANTIC / BYPASS per request
    false_hit: npt.NDArray[np.bool_]  # a semantic hit served from an entry with another label
    served_by: npt.NDArray[np.int64]  # the key whose entry served a semantic hit, else -1


def simulate(log: KeyedLog, candidates: list[list[int]] | None, ttl_s: float) -> Replayed:
    """Replay `log` through a cache with entries living `ttl_s`; candidates=None: exact only."""
    n_keys = len(log.key_prompt)
    expires = [float("-inf")] * n_keys
    owner = [-1] * n_keys  # label of the request whose miss wrote the entry
    labels = log.label.tolist() if log.label is not None else [-1] * log.requests
    no_candidates: list[list[int]] = [[]] * n_keys
    cands = candidates if candidates is not None else no_candidates
    outcome = bytearray(log.requests)  # MISS = 0
    false_hit = bytearray(log.requests)
    served_by = [-1] * log.requests
    for i, (k, t) in enumerate(zip(log.key.tolist(), log.ts.tolist(), strict=True)):
        if k < 0:
            outcome[i] = BYPASS
        elif expires[k] > t:
            outcome[i] = EXACT
        else:
            for j in cands[k]:
                if expires[j] > t:
                    outcome[i] = SEMANTIC
                    served_by[i] = j
                    false_hit[i] = owner[j] >= 0 and labels[i] >= 0 and owner[j] != labels[i]
                    break
            else:
                expires[k] = t + ttl_s
                owner[k] = labels[i]
    return Replayed(
        np.frombuffer(bytes(outcome), dtype=np.int8).copy(),
        np.frombuffer(bytes(false_hit), dtype=np.bool_).copy(),
        np.asarray(served_by, dtype=np.int64),
    )


@dataclass(frozen=True)
class Duplicates:
    """With no TTL and no capacity limit: what an ideal cache could have answered at all."""

    exact: npt.NDArray[np.bool_]  # an earlier request had the same exact key
    near: dict[float, npt.NDArray[np.bool_]]  # not exact, but an earlier one was within cosine


def duplicates(log: KeyedLog, nb: Neighbours, thresholds: tuple[float, ...]) -> Duplicates:
    """Exact duplicates and, per threshold, near duplicates, each against every earlier request."""
    n = log.requests
    idx = np.arange(n)
    cacheable = log.key >= 0
    first = np.full(len(log.key_prompt), n, dtype=np.int64)  # first request of each key
    np.minimum.at(first, log.key[cacheable], idx[cacheable])
    safe_key = np.where(cacheable, log.key, 0)
    exact = cacheable & (first[safe_key] < idx)
    # earliest first-appearance among each key's neighbours, as a running min down its list
    runs = [np.minimum.accumulate(first[ids]) if len(ids) else ids for ids in nb.ids]
    near: dict[float, npt.NDArray[np.bool_]] = {}
    for thr in thresholds:
        earliest = np.full(len(first), n, dtype=np.int64)
        for k, (run, sims) in enumerate(zip(runs, nb.sims, strict=True)):
            m = int(np.searchsorted(-sims, -thr, side="right")) if len(sims) else 0
            if m:
                earliest[k] = run[m - 1]
        near[thr] = cacheable & ~exact & (earliest[safe_key] < idx)
    return Duplicates(exact, near)
