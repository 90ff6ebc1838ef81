"""`stoker demo --simulated --seeds N`: the simulated run N times, each regime's figures as the
mean and spread over the runs.

One run is not a measurement: the same traffic served twice gives other figures, because a
warm is priced again at the load the backend shows when it is sent (warmers/shadow.py), and
that load is the warm's own burst and the concurrent requests of the hour, which the machine's
timing decides. So the runs differ by timing, not by traffic: each replays the same log.
Run i writes its own report and plots to `out/seed-<i>`; `out/report.json` is the first run's
report with `over_seeds` added.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from rich.console import Console

from demo.report import write
from demo.scenario import Scenario

# The figures the goals are read on, and the floors they are measured against.
FIGURES = (
    "peak_gpu_ratio", "peak_capture", "total_gpu_ratio", "warm_efficiency",
    "post_deploy_gap_points", "peak_gpu_ratio_bound", "peak_gpu_ratio_bound_frequent",
)  # fmt: skip

RunDemo = Callable[[Path, Scenario, str, Console], dict[str, Any]]


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


def over_seeds(reports: Sequence[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per regime (those of the first report), each of FIGURES over the reports."""
    out: dict[str, dict[str, Any]] = {}
    for name in reports[0]["regimes"]:
        rows = [r["regimes"].get(name, {}) for r in reports]
        out[name] = {k: spread([f.get(k) for f in rows]) for k in FIGURES}
    return out


def run_seeds(
    out: Path, sc: Scenario, mode: str, console: Console, seeds: int, run_demo: RunDemo
) -> list[dict[str, Any]]:
    """`seeds` runs of run_demo, each in out/seed-<i>; writes out/report.json, the first run's
    report with over_seeds; returns every run's report (each has its own invariants)."""
    reports = []
    for i in range(1, seeds + 1):
        console.print(f"stoker demo: run {i} of {seeds}", highlight=False)
        reports.append(run_demo(out / f"seed-{i}", sc, mode, console))
    report = reports[0] | {"seeds": seeds, "over_seeds": over_seeds(reports)}
    write(report, out)
    for name, figs in report["over_seeds"].items():
        cells = [
            f"{k} {v['mean']:.3f} (sd {v['sd']:.3f}, {v['min']:.3f}-{v['max']:.3f})"
            for k, v in figs.items()
            if v is not None
        ]
        console.print(f"{name} over {seeds} runs: " + "; ".join(cells), highlight=False)
    return reports
