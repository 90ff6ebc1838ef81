"""`stoker demo` on the real model: run the live day, write report.json, summary.txt and the
plots, print the summary, and fail (exit 1) when an invariant broke."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rich.console import Console

from demo.live import plots as live_plots
from demo.live.report import build_live_report, summary, verdict, write, write_records
from demo.live.run import LiveDemo
from demo.live.scenario import LiveScenario
from demo.progress import DemoProgress
from schemas.errors import StokerError


def run_live_demo(out: Path, sc: LiveScenario, console: Console) -> dict[str, Any]:
    """One live run; off a terminal a progress line comes at least every 10 s."""
    with DemoProgress(console) as bar:
        res = LiveDemo(sc, bar).run()
        bar.phase("writing the report and the plots")
        report = build_live_report(res)
        path = write(report, out)
        write_records(res, out)
        text = summary(report)
        (out / "summary.txt").write_text(text + "\n")
        pngs = live_plots.all_plots(report, out)
    console.print(text, highlight=False, soft_wrap=True, markup=False)
    for label, file in [("report", path), *(("plot", p) for p in pngs)]:
        console.print(f"{label}: {file}", highlight=False, soft_wrap=True)  # a path kept whole
    broken = verdict(report, len(res.traffic.day))
    if broken:
        raise StokerError("live demo invariants broken: " + "; ".join(broken))
    return report


def main_live(out: Path, console: Console, *, tiny: bool = False) -> dict[str, Any]:
    return run_live_demo(out, LiveScenario.tiny() if tiny else LiveScenario(), console)
