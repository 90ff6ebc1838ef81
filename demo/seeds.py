"""Figures over several runs: each one's mean, spread and range (`stoker demo --simulated
--seeds N`, the benchmarks' SeedRows). One log is not a measurement: the runs replay the sample
log's spec made with other seeds."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any


def spread(values: Sequence[float | None]) -> dict[str, Any] | None:
    """Mean, sample standard deviation (0 for one value), min and max of the values that are
    not None, and how many there were; None when none is."""
    xs = [float(x) for x in values if x is not None]
    if not xs:
        return None
    sd = statistics.stdev(xs) if len(xs) > 1 else 0.0
    return {
        "mean": round(statistics.fmean(xs), 4),
        "sd": round(sd, 4),
        "min": round(min(xs), 4),
        "max": round(max(xs), 4),
        "runs": len(xs),
    }


def over_seeds(
    reports: Sequence[dict[str, Any]], figures: Sequence[str]
) -> dict[str, dict[str, Any]]:
    """Per regime (those of the first report), each of `figures` over the reports."""
    out: dict[str, dict[str, Any]] = {}
    for name in reports[0]["regimes"]:
        rows = [r["regimes"].get(name, {}) for r in reports]
        out[name] = {k: spread([f.get(k) for f in rows]) for k in figures}
    return out
