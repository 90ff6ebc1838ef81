"""Whether the backend's answers can vouch for a look-alike, learned from its own traffic.

The verified ladder (verified.py) and the monitor (audits/judge.py) both read one signal:
two answers "agree" when their embeddings' cosine clears the judge's bar (answers.py). That
signal is worth something only if the backend answers one meaning alike and other meanings
otherwise. The simulator does (it was built to); a real model may not: on SmolLM2-135M-Instruct
about a quarter of same-intent pairs at prompt cosine >= 0.9 fell under the bar (0.52 then), and about
a quarter of other-intent pairs cleared it (bench_semantic_quality: semantic_quality_clinc_real;
docs/benchmarks.md, "Semantic quality"). A judge that calls a quarter of right hits wrong can
never show a 1% budget, and one that calls a quarter of wrong neighbours agreeing vouches for
them.

So the matcher checks the signal on two kinds of pair that need no label:
- near pairs: prompt cosine >= NEAR (0.85; on CLINC150 with all-MiniLM-L6-v2 such
  look-alikes share their intent ~98% of the time): their answers should agree. The share
  that disagree estimates the judge's false alarms (1 - its power) for pairs that mean the
  same. 0.85, under the fallback's 0.88, so that a miss's look-alikes the fallback did not
  serve are checks too, at no cost (the miss's live answer is there anyway);
- unrelated pairs: prompt cosine < UNRELATED (0.30: other meanings, all but surely): their
  answers should disagree. The share that agree estimates how often the judge vouches for a
  pair that does not mean the same (a floor: look-alikes of other meanings agree more often).
Both kinds come from live traffic: a miss's live answer against its neighbours' (the store-time
check, caches/client.py) and against an earlier answer of an unrelated prompt, and the
monitor's re-asks against the answers they audit. Their counts live in the error budget's
store, two slots past the cold rule's (error_budget.py), per tenant (every route's traffic feeds and
reads them), shared by replicas.

The answers vouch (`AnswerSignal.state` "separates") when both rates are shown, at 95%, at or
under their maximum: false alarms <= MAX_FALSE_ALARM (10%), false agreement <= MAX_FALSE_AGREE
(10%); "blind" when either is shown over it; "unknown" until one or the other is shown. Only
"separates" lets the ladder and the cold rule's answer veto serve; otherwise the matcher serves
the prompt-only rule (fallback.py) and says so (rule and X-Stoker-Reason "fallback").
"""

from __future__ import annotations

import functools
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Literal

import numpy as np

from caches.matching.base import Query, Vector
from caches.matching.error_budget import (
    ErrorBudget,
    Evidence,
    LevelBound,
    ServingLevels,
    shown_within,
)

State = Literal["separates", "blind", "unknown"]
# The checks are kept per tenant, not per route: how a backend answers is the backend's (and the
# tenant's system prompt's), and every route's traffic feeds them sooner together.
ROUTE = ""
NEAR = 0.85
UNRELATED = 0.30
MAX_FALSE_ALARM = 0.10
MAX_FALSE_AGREE = 0.10


@dataclass(frozen=True)
class AnswerSignal:
    """The two checks' counts for one (tenant, route): near pairs (checked, disagreed) and
    unrelated pairs (checked, agreed)."""

    near: LevelBound
    unrelated: LevelBound

    @functools.cached_property
    def state(self) -> State:
        alarm, agree = self.near, self.unrelated
        if _shown_over(alarm, MAX_FALSE_ALARM) or _shown_over(agree, MAX_FALSE_AGREE):
            return "blind"
        if alarm.within(MAX_FALSE_ALARM) and agree.within(MAX_FALSE_AGREE):
            return "separates"
        return "unknown"

    def rates(self) -> dict[str, float | int]:
        """The point estimates and their counts, for metrics and reasons."""
        n, u = self.near, self.unrelated
        return {
            "near_pairs": n.checked,
            "false_alarm": n.wrong / n.checked if n.checked else 0.0,
            "unrelated_pairs": u.checked,
            "false_agree": u.wrong / u.checked if u.checked else 0.0,
        }

    def describe(self) -> str:
        r = self.rates()
        return (
            f"answers {self.state} (near pairs disagree {r['false_alarm']:.0%} of "
            f"{r['near_pairs']}, unrelated agree {r['false_agree']:.0%} of "
            f"{r['unrelated_pairs']})"
        )


def _shown_over(b: LevelBound, rate: float) -> bool:
    """The rate's lower 95% bound is over `rate`: the other outcome's rate is shown within
    1 - rate (one binomial CDF, as budget.shown_within; a lookup reads this)."""
    return shown_within(b.checked - b.wrong, b.checked, 1.0 - rate)


def band(score: float) -> Literal["near", "unrelated"] | None:
    """Which check a pair at prompt cosine `score` feeds, if any."""
    if score >= NEAR:
        return "near"
    if score < UNRELATED:
        return "unrelated"
    return None


class RecentAnswers:
    """A few recent (prompt vector, answer vector) per tenant and route: what a new live
    answer is compared with for the unrelated check. Bounded: `per_pair` answers for each of
    at most `max_pairs` (tenant, route), least recently used evicted. Thread-safe."""

    def __init__(self, per_pair: int = 16, max_pairs: int = 1_000, seed: int = 0) -> None:
        self.per_pair = per_pair
        self.max_pairs = max_pairs
        self._lock = threading.Lock()
        self._rng = np.random.default_rng(seed)
        self._kept: OrderedDict[tuple[str, str], list[tuple[Vector, Vector]]] = OrderedDict()

    def unrelated_to(self, tenant: str, route: str, prompt: Vector) -> Vector | None:
        """The answer of a kept prompt unrelated to `prompt` (cosine < UNRELATED), if any."""
        with self._lock:
            kept = list(self._kept.get((tenant, route), ()))
        for i in self._rng.permutation(len(kept)):
            p, a = kept[int(i)]
            if float(p @ prompt) < UNRELATED:
                return a
        return None

    def keep(self, tenant: str, route: str, prompt: Vector, answer: Vector) -> None:
        pair = (tenant, route)
        with self._lock:
            kept = self._kept.setdefault(pair, [])
            self._kept.move_to_end(pair)
            if len(kept) < self.per_pair:
                kept.append((prompt, answer))
            else:
                kept[int(self._rng.integers(self.per_pair))] = (prompt, answer)
            while len(self._kept) > self.max_pairs:
                self._kept.popitem(last=False)


def signal_of(ev: Evidence | None) -> AnswerSignal | None:
    """The answer checks of a route's evidence (None: not read yet)."""
    return None if ev is None else AnswerSignal(ev.near, ev.unrelated)


class AnswerChecks:
    """Feeds the two checks into the budget's counts: from a miss's live answer (against the
    near look-alikes the lookup found, and one earlier unrelated answer), and from an audit of
    a hit at prompt cosine >= NEAR. `agree`: the judge's pair test (AnswerJudge.agree)."""

    def __init__(
        self,
        budget: ErrorBudget,
        agree: Callable[[Vector, Vector], bool],
        recent: RecentAnswers | None = None,
    ) -> None:
        self.budget = budget
        self.agree = agree
        self.recent = recent or RecentAnswers()

    def live(
        self, tenant: str, prompt: Vector, answer: Vector, near: Sequence[Vector] = ()
    ) -> None:
        for other in near:
            self.budget.record_check(tenant, ROUTE, True, not self.agree(answer, other))
        far = self.recent.unrelated_to(tenant, ROUTE, prompt)
        if far is not None:
            self.budget.record_check(tenant, ROUTE, False, self.agree(answer, far))
        self.recent.keep(tenant, ROUTE, prompt, answer)

    def audited(self, tenant: str, score: float, same: bool) -> None:
        if band(score) == "near":
            self.budget.record_check(tenant, ROUTE, True, not same)

    def signal(self, levels: ServingLevels, q: Query) -> AnswerSignal | None:
        """The query's tenant's checks, as `levels` last read them."""
        return signal_of(levels.evidence_of(replace(q, route=ROUTE)))
