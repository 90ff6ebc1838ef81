"""The demo's scenario: which traffic, which events when, and the knobs of default vs --fast."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import orjson
import pandas as pd

from stoker.data import REPO_DATA_DIR

SAMPLE_LOG = REPO_DATA_DIR / "sample" / "requests-2w.parquet"
NEW_VERSION = "2026-11-12"


@dataclass(frozen=True)
class Scenario:
    """Week 1 trains the profile; week 2 is served twice (warming on, then off), once per TTL
    regime (`regimes`)."""

    log: Path = SAMPLE_LOG
    sample_every: int = 1  # keep every n-th request (by request id): --fast thins traffic
    week2_hours: int = 7 * 24
    regime: str = "ttl_1d"
    ttl_h: int = 24  # entries' TTL on the simulated clock (demo.clock)
    first_h: int = 0  # the regime serves week 2's hours first_h .. week2_hours - 1
    warm_every_h: int = 2  # the scheduler runs every this many hours ...
    warm_horizon_h: int = 6  # ... and warms the hot set of the next this many hours
    warm_budget: int = 80  # warm requests per window, shared across tenants
    warm_qps: float = 400.0  # against the simulated backend (compressed time)
    deploy_at_h: int = 3 * 24 + 12  # Thursday noon of week 2: v2 replaces v1
    grace_s: int = 3  # wall seconds of grace before the old version is retired and purged
    kb_change_at_h: tuple[int, ...] = (30, 80, 130)  # hours into week 2
    kb_docs_per_change: int = 2
    # Warms held to each send hour's headroom: this share of the busiest hour the baseline is
    # forecast to see, less the hour's own forecast (demo/headroom.py); None: not held. Under
    # 1, so that a send hour filled to its cap still sits below the peak warming should lower.
    headroom_share: float | None = 0.9
    # The deploy announced this many hours ahead: its pre-warm spreads over them (under the
    # headroom). Only where entries warmed then outlive the cutover's freshness check.
    deploy_lead_h: int = 6

    @classmethod
    def fast(cls) -> Scenario:
        return cls(
            sample_every=3,
            week2_hours=36,
            warm_budget=80,
            deploy_at_h=30,
            grace_s=1,
            kb_change_at_h=(12, 33),
        )

    def regimes(self) -> list[Scenario]:
        """The two regimes the report compares: TTL 1 day (the whole span, warming the next
        6 hours every 2 hours), and TTL 3 h with an hourly warm of the next 3 hours (the
        warm goes out in the 30 minutes before each hour; cached entries expiring inside the
        window are refreshed ahead). The 3-hour regime serves the 3 days around the deploy
        (the 12 hours around it in --fast), to keep the demo's run time."""
        half = 36 if self.week2_hours > 48 else 6
        short = replace(
            self, regime="ttl_3h", ttl_h=3, warm_every_h=1, warm_horizon_h=3,
            first_h=max(0, self.deploy_at_h - half), deploy_lead_h=0,
            week2_hours=min(self.week2_hours, self.deploy_at_h + half),
        )  # fmt: skip
        return [self, short]

    @property
    def served_hours(self) -> range:
        return range(self.first_h, self.week2_hours)


@dataclass
class Traffic:
    week1: list[dict[str, Any]]
    week2: list[dict[str, Any]]
    start2: datetime  # week 2's first instant
    kb_docs: list[str] = field(default_factory=list)  # the most asked RAG docs of week 1

    def hour_of(self, row: dict[str, Any]) -> int:
        return int((row["ts"] - self.start2).total_seconds() // 3600)


def load_traffic(sc: Scenario) -> Traffic:
    df = pd.read_parquet(sc.log)
    if sc.sample_every > 1:
        keep = df.request_id.str[-6:].astype(int) % sc.sample_every == 0
        df = df[keep]
    start = df.ts.min().floor("D")
    start2 = start + pd.Timedelta(days=7)
    end2 = start2 + pd.Timedelta(hours=sc.week2_hours)
    week1 = df[df.ts < start2]
    week2 = df[(df.ts >= start2) & (df.ts < end2)]
    docs = week1.context_docs.map(orjson.loads).explode().dropna().map(lambda d: d["doc_id"])
    top_docs = list(docs.value_counts().index[: sc.kb_docs_per_change * len(sc.kb_change_at_h)])
    return Traffic(
        week1=_records(week1),
        week2=_records(week2),
        start2=start2.to_pydatetime(),
        kb_docs=top_docs,
    )


def _records(df: pd.DataFrame) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = df.to_dict("records")
    for r in rows:
        r["ts"] = r["ts"].to_pydatetime()
    return rows


def hours(start: datetime, n: int) -> list[datetime]:
    return [start + timedelta(hours=h) for h in range(n)]
