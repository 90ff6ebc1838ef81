"""`stoker demo --simulated`: two weeks of the sample log through `stoker analyze --warming`, told
as a story: week 1 learned, week 2 replayed with the shipped warming and without, in two TTL
regimes, with a model deploy on Thursday noon and three knowledge-base changes.

Everything that warms is `stoker analyze --warming`'s (stoker/warming_replay.py: the shipped
planner, scheduler, headroom, pacing and deploy pre-warm, with the settings' defaults but the
TTL); this module picks the story's events and says what they did. Its figures rest on the
replay: an exact cache and a model server priced from the log's own gpu_ms, in virtual time.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from stoker.data import SAMPLE_LOG
from stoker.settings import StokerSettings
from stoker.warming_replay import LoadedLog, Story, analyze_warming, load_log

TTLS = (86_400, 10_800)  # the two regimes: entries live a day, or three hours


@dataclass(frozen=True)
class Scenario:
    """Week 1 trains the profile; `hours` of week 2 are replayed in each TTL regime."""

    log: Path = SAMPLE_LOG
    hours: int = 7 * 24
    deploy_at_h: int = 3 * 24 + 12  # Thursday noon of week 2: a new model version goes live
    kb_change_at_h: tuple[int, ...] = (30, 80, 130)  # hours into week 2
    kb_docs_per_change: int = 2

    @classmethod
    def fast(cls) -> Scenario:
        """Two days of week 2: the deploy on Tuesday evening, a KB change each day."""
        return cls(hours=48, deploy_at_h=42, kb_change_at_h=(12, 33))

    def with_log(self, log: Path) -> Scenario:
        return replace(self, log=log)


def week2_start(log: LoadedLog) -> datetime:
    first = log.first.replace(hour=0, minute=0, second=0, microsecond=0)
    return first + timedelta(days=7)


def kb_changes(log: LoadedLog, start: datetime, sc: Scenario) -> list[tuple[datetime, str, str]]:
    """The story's knowledge-base changes: at each hour of sc.kb_change_at_h, the most cited
    documents of week 1 (sc.kb_docs_per_change of them, the next ones each time) change for
    every tenant that cited them."""
    cited: Counter[tuple[str, str]] = Counter()
    for ev in log.events:
        if ev.ts >= start:
            break
        for d in ev.context_docs:
            cited[(ev.tenant, d.doc_id)] += 1
    docs = [d for d, _ in Counter({d: n for (_, d), n in cited.items()}).most_common()]
    out = []
    n = sc.kb_docs_per_change
    for k, h in enumerate(sc.kb_change_at_h):
        at = start + timedelta(hours=h)
        for doc in docs[k * n : (k + 1) * n]:
            out += [(at, tenant, doc) for tenant, d in sorted(cited) if d == doc]
    return out


def run_story(
    sc: Scenario,
    settings: StokerSettings | None = None,
    progress: Callable[[str, float], None] | None = None,
) -> dict[str, Any]:
    """The replay of the story: stoker analyze --warming's report, with the story's events."""
    log = load_log(sc.log)
    start = week2_start(log)
    end = min(start + timedelta(hours=sc.hours), log.last + timedelta(seconds=1))
    story = Story(start + timedelta(hours=sc.deploy_at_h), tuple(kb_changes(log, start, sc)))
    s = settings or StokerSettings()
    report = analyze_warming(s, log, start, TTLS, story, progress, end)
    report["story"] = {"hours": sc.hours, "deploy_at_h": sc.deploy_at_h,
                       "kb_change_at_h": list(sc.kb_change_at_h)}  # fmt: skip
    for f in report["regimes"].values():
        f["paid"] = paid(f)
        f["headline"] = headline(f)
    return report


# Warming pays in a regime when it cuts the peak hour's GPU (what a cluster is provisioned
# for) by 5% or more at no more than 5% extra GPU in all, or saves GPU in all.
PEAK_PAYS, TOTAL_ALLOWED = 0.95, 1.05


def paid(f: dict[str, Any]) -> bool:
    peak, total = f.get("peak_gpu_ratio") or 1.0, f.get("total_gpu_ratio") or 1.0
    return total < 1.0 or (peak <= PEAK_PAYS and total <= TOTAL_ALLOWED)


def headline(f: dict[str, Any]) -> str:
    """The regime's answer in one sentence, with the figures it rests on."""
    peak, total = f.get("peak_gpu_ratio") or 1.0, f.get("total_gpu_ratio") or 1.0
    eff = f.get("warm_efficiency")
    sends = f"{f['warm_sends']:,} warm sends" + (
        "" if eff is None else f", {eff:.0%} of them adding a hit"
    )
    verdict = "paid" if paid(f) else "did not pay"
    need = (
        ""
        if paid(f)
        else f" (paying needs the peak <= {PEAK_PAYS}x at <= {TOTAL_ALLOWED}x total, or less GPU)"
    )
    ttl = f["ttl_s"] / 3600
    return (
        f"TTL {ttl:g} h: warming {verdict}: the peak hour at {peak:.2f}x and total GPU at "
        f"{total:.3f}x of no warming; {sends}{need}"
    )
