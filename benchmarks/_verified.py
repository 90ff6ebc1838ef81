"""Coverage under the default (verified) matcher: which of a window's requests a cache holding
only the warmed entries would serve (bench_hot_set's `hot_set_k<K>_verified_l<level>` rows).

A request is served when its normalised text is a warmed prompt (the exact cache), or when
caches/matching/verified.py, held at one level of its ladder, accepts one of the warmed
entries among the request's nearest (its score, and other warmed entries near the request
whose answers agree with that entry's, and the margin over any whose answers differ).

The entries' answers come from the simulated backend (simulation/backend/phrasing.py), told which
prompts share a meaning by the log's intent label, as `stoker eval-semantic` does: a model that
understands every question answers paraphrases alike, in its own words. That is the simulator's
convenience, and these rows depend on it; the matcher reads prompts, vectors and answers only.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
from _coverage import Embeds

from caches.matching.base import Candidate, Query
from caches.matching.verified import VerifiedMatcher
from simulation.backend.simulator import SimConfig, Simulator

MODEL = "sample-model"


class SimAnswers:
    """The embedded answer the simulated backend gives each prompt (what a warm's entry holds),
    worked out once per prompt: the bench asks for the same warmed prompts every day, at every
    level."""

    def __init__(self, emb: Embeds, meanings: Mapping[str, str]) -> None:
        """meanings: normalised prompt -> meaning id (for the simulated backend only)."""
        self.emb = emb
        self.sim = Simulator(SimConfig(meanings=dict(meanings)))
        self.memo: dict[str, np.ndarray] = {}

    def __call__(self, prompts: list[str]) -> np.ndarray:
        todo = [p for p in dict.fromkeys(prompts) if p not in self.memo]
        if todo:
            texts = [self.sim.answer_for(MODEL, p, None).text for p in todo]
            self.memo.update(zip(todo, self.emb.embed(texts), strict=True))
        return np.stack([self.memo[p] for p in prompts])


class VerifiedScorer:
    def __init__(self, emb: Embeds, answers: SimAnswers, level: int) -> None:
        self.emb, self.level = emb, level
        self.answers = answers
        self.matcher = VerifiedMatcher(lambda q: level)

    def served(self, asked: list[str], warmed: list[str]) -> int:
        """How many of `asked` (normalised texts, repeats counted) the warmed entries serve."""
        if not asked or not warmed:
            return 0
        uniq, counts = np.unique(np.asarray(asked, dtype=object), return_counts=True)
        names = sorted(set(warmed))
        exact = set(names)
        qv, pv = self.emb.embed(uniq.tolist()), self.emb.embed(names)
        av = self.answers(names)
        scores = qv @ pv.T
        m = self.matcher
        floor, limit = min(m.neighbour_floor, m.ladder[0].score), m.limit
        got = 0
        for i, text in enumerate(uniq.tolist()):
            if text in exact:
                got += int(counts[i])
                continue
            row = scores[i]
            near = np.flatnonzero(row >= floor)
            near = near[np.argsort(-row[near])][:limit]
            if not len(near):
                continue
            cands = [
                Candidate(str(j), names[j], float(row[j]), answer=av[j]) for j in near.tolist()
            ]
            if self.matcher.decide(Query(text, qv[i], threshold=0.92), cands) is not None:
                got += int(counts[i])
        return got
