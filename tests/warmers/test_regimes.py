"""Day regimes: the sample log's weekdays and weekends come out as two clusters."""

from __future__ import annotations

from datetime import date, timedelta
from pathlib import Path

import numpy as np
import pandas as pd

from warmers.hotset.regimes import cluster_days

SAMPLE = Path(__file__).resolve().parents[2] / "data" / "sample" / "requests-2w.parquet"


def _daily(df: pd.DataFrame) -> dict[date, list[int]]:
    counts = df.groupby([df.ts.dt.date, df.ts.dt.hour]).size().unstack(fill_value=0)
    counts = counts.reindex(columns=range(24), fill_value=0)
    return {d: [int(x) for x in row] for d, row in zip(counts.index, counts.values, strict=True)}


def test_dayclusters__sample_log_splits_weekdays_from_weekends() -> None:
    df = pd.read_parquet(SAMPLE, columns=["ts", "tenant"])
    for tenant in [None, *sorted(df.tenant.unique())]:
        part = df if tenant is None else df[df.tenant == tenant]
        regimes = cluster_days(_daily(part))
        assert regimes.k == 2, tenant
        weekend = {r for d, r in regimes.labels.items() if d.weekday() >= 5}
        weekday = {r for d, r in regimes.labels.items() if d.weekday() < 5}
        assert len(weekend) == len(weekday) == 1 and weekend != weekday, tenant
        names = {regimes.describe(r) for r in weekend | weekday}
        assert names == {"weekday", "weekend"}


def test_dayclusters__a_future_day_takes_its_weekdays_regime() -> None:
    regimes = cluster_days(_daily(pd.read_parquet(SAMPLE, columns=["ts"])))
    last = max(regimes.labels)
    next_saturday = last + timedelta(days=(5 - last.weekday()) % 7 or 7)
    days = regimes.matching_days(next_saturday)
    assert days and all(d.weekday() >= 5 for d in days)


def test_dayclusters__one_regime_when_days_look_alike_or_are_few() -> None:
    rng = np.random.default_rng(0)
    start = date(2026, 1, 5)
    alike = {start + timedelta(days=i): list(rng.poisson(100, 24)) for i in range(14)}
    assert cluster_days(alike).k == 1
    few = {start + timedelta(days=i): [10] * 24 for i in range(3)}
    regimes = cluster_days(few)
    assert regimes.k == 1 and regimes.matching_days(start + timedelta(days=9)) == sorted(few)
    assert cluster_days({}).matching_days(start) == []
