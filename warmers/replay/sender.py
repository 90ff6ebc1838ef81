"""The replay's warm sends: a plan's items into the virtual cache, paced, in virtual time.

The shadow warmer's rules (warmers/shadow.py, step 1) on the virtual cache: what must not be
cached is skipped, and so is what is cached with more left than the item's refresh bar (or
`min_ttl_left_s`); the rest goes out one every 1/qps seconds from the run's start and lands
as it is sent. Each send costs the GPU what the profile learned a miss of its query costs
(PlanItem.warm_cost_ms), counted in the hour it goes out in. The virtual model server reports
no load gauges, so, as for a server without /metrics, the plan's choice stands (no send is
priced out at send time).
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime

from caches.policy import request_bypass_reason
from warmers.hotset.plan import Plan
from warmers.replay.cache import Entry, Ledger, VirtualCache
from warmers.shadow import WarmSummary


class VirtualSender:
    """WarmRunner.send for a replay: `__call__(plan)` sends it and returns the run's summary."""

    def __init__(
        self,
        cache: VirtualCache,
        ledger: Ledger,
        clock: Callable[[], datetime],
        qps: float,
        min_ttl_left_s: float,
    ) -> None:
        self.cache, self.ledger, self.clock = cache, ledger, clock
        self.qps, self.min_ttl_left_s = qps, min_ttl_left_s
        self.sends = 0  # over the replay
        self.sent: list[Entry] = []  # every entry a send put there, in send order

    def __call__(self, plan: Plan) -> WarmSummary:
        s = WarmSummary()
        t0 = self.clock().timestamp()
        for pi, item in zip(plan.items, plan.warm_items(), strict=True):
            ident = item.identity
            if request_bypass_reason(ident.params):
                s.skipped_uncacheable += 1
                continue
            key = ident.key().exact()
            bar = self.min_ttl_left_s if item.refresh_under_s is None else item.refresh_under_s
            t = t0 + s.sent / self.qps
            e = self.cache.get(key, t)
            if e is not None and e.expires - t > bar:
                s.skipped_cached += 1
                continue
            docs = tuple(d.doc_id for d in ident.docs)
            self.sent.append(self.cache.put(key, t, warm=True, docs=docs))
            self.ledger.sent(t, pi.warm_cost_ms)
            s.sent += 1
            s.cached += 1
            s.gpu_seconds += pi.warm_cost_ms / 1000.0
            s.sent_keys.append(key)
            s.landed_keys.append(key)
        s.elapsed_s = s.sent / self.qps
        s.achieved_qps = s.final_rate_qps = self.qps if s.sent else 0.0
        self.sends += s.sent
        return s
