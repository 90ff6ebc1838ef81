"""`stoker demo`: the whole story in one run (see README): both passes, report, plots, verdict."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rich.console import Console

from demo import plots
from demo.progress import DemoProgress
from demo.report import build_report, print_report, regime_figures, write
from demo.run import Embeddings, Pass
from demo.scenario import Scenario, load_traffic
from schemas.errors import StokerError


def run_demo(out: Path, sc: Scenario, mode: str, console: Console) -> dict[str, Any]:
    """Every regime of `sc`, each served with warming and without, then the report and plots.
    Off a terminal a progress line comes at least every 10 s (demo.progress)."""
    from demo.headroom import HeadroomWarming
    from demo.warming import DemoWarming

    with DemoProgress(console) as bar:
        bar.phase("loading the two-week sample log")
        traffic = load_traffic(sc)
        regimes = sc.regimes()
        console.print(
            f"week 1: {len(traffic.week1):,} requests replayed through Kafka into the traffic "
            f"profile; week 2: {len(traffic.week2):,} requests over {sc.week2_hours} h, served "
            f"twice (with and without warming) in each of {len(regimes)} TTL regimes, against "
            "the simulated GPU backend",
            highlight=False,
        )
        # week 2's prompts are embedded up front (the serving path would otherwise wait on the
        # model); week 1's are embedded on demand, when the hot set picks them
        emb = Embeddings(traffic.week2)
        figures: dict[str, dict[str, Any]] = {}
        runs = []
        for rg in regimes:
            factory = (
                DemoWarming.factory(rg)
                if rg.headroom_share is None
                else HeadroomWarming.capped(rg, traffic)
            )
            warm = Pass(rg, traffic, True, bar, emb).run(factory)
            console.print(f"{rg.regime}: pass 1 (warming on) done in {warm.seconds:.0f} s")
            base = Pass(rg, traffic, False, bar, emb).run(None)
            console.print(
                f"{rg.regime}: pass 2 (baseline, warming off) done in {base.seconds:.0f} s"
            )
            figures[rg.regime] = regime_figures(warm, base, rg)
            runs.append((rg, warm, base))
        bar.phase("writing the report and the plots")
        report = build_report(figures, sc.regime, mode)
        path = write(report, out)
        pngs = plots.all_plots(runs, figures, out)
    print_report(report, console)
    console.print(f"report: {path}; plots: {', '.join(str(p) for p in pngs)}", highlight=False)
    return report


def verdict(report: dict[str, Any]) -> list[str]:
    """The invariants the demo promises; any broken one fails the run (exit 1)."""
    broken = []
    if report["stale_hits"]:
        broken.append(f"{report['stale_hits']} stale hits")
    if report["cross_tenant_hits"]:
        broken.append(f"{report['cross_tenant_hits']} cross-tenant hits")
    for name, f in report["regimes"].items():
        for d in (f.get("deploy") or {}, f.get("deploy_baseline") or {}):
            if d.get("old_version_keys_left"):
                left = d["old_version_keys_left"]
                broken.append(f"{name}: {left} keys of the retired version left after DONE")
    return broken


def main(out: Path, fast: bool, console: Console, seeds: int = 1) -> None:
    sc = Scenario.fast() if fast else Scenario()
    mode = "fast" if fast else "default"
    if seeds > 1:
        from demo.seeds import run_seeds

        reports = run_seeds(out, sc, mode, console, seeds, run_demo)
    else:
        reports = [run_demo(out, sc, mode, console)]
    broken = [b for report in reports for b in verdict(report)]
    if broken:
        raise StokerError("demo invariants broken: " + "; ".join(broken))
