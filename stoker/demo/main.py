"""`stoker demo`: the whole story in one run (see README): both passes, report, plots, verdict."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rich.console import Console

from schemas.errors import StokerError
from stoker.demo import plots
from stoker.demo.report import build_report, print_table, regime_figures, write
from stoker.demo.run import Embeddings, Pass, PassResult
from stoker.demo.scenario import Scenario, load_traffic


def run_demo(out: Path, fast: bool, console: Console) -> dict[str, Any]:
    from stoker.demo.warming import DemoWarming

    sc = Scenario.fast() if fast else Scenario()
    with console.status("loading the two-week sample log ..."):
        traffic = load_traffic(sc)
    regimes = sc.regimes()
    console.log(
        f"week 1: {len(traffic.week1):,} requests replayed through Kafka into the traffic "
        f"profile; week 2: {len(traffic.week2):,} requests over {sc.week2_hours} h, served "
        f"twice (with and without warming) in each of {len(regimes)} TTL regimes"
    )
    # week 2's prompts are embedded up front (the serving path would otherwise wait on the
    # model); week 1's are embedded on demand, when the hot set picks them
    emb = Embeddings(traffic.week2)
    runs: dict[str, tuple[Scenario, PassResult, PassResult]] = {}
    for rg in regimes:
        warm = Pass(rg, traffic, True, console, emb).run(DemoWarming.factory(rg))
        console.log(f"{rg.regime}: pass 1 (warming on) done in {warm.seconds:.0f} s")
        base = Pass(rg, traffic, False, console, emb).run(None)
        console.log(f"{rg.regime}: pass 2 (baseline, warming off) done in {base.seconds:.0f} s")
        runs[rg.regime] = (rg, warm, base)
    _, warm, base = runs[sc.regime]
    report = build_report(warm, base, fast)
    report["regimes"] = {name: regime_figures(w, b, rg) for name, (rg, w, b) in runs.items()}
    path = write(report, out)
    deploy_h = warm.deploy.get("hour") if warm.deploy else None
    pngs = [
        plots.hit_rate(warm, base, sc.week2_hours, deploy_h, out),
        plots.warm_qps(warm, out),
        plots.purge_progress(warm, out),
        *(plots.gpu_demand(name, report["regimes"][name], out) for name in runs),
    ]
    print_table(report, console)
    for f in report["regimes"].values():
        console.print(f["verdict"])
    console.print(f"report: {path}; plots: {', '.join(str(p) for p in pngs)}")
    return report


def verdict(report: dict[str, Any]) -> list[str]:
    """The invariants the demo promises; any broken one fails the run (exit 1)."""
    broken = []
    if report["stale_hits"]:
        broken.append(f"{report['stale_hits']} stale hits")
    if report["cross_tenant_hits"]:
        broken.append(f"{report['cross_tenant_hits']} cross-tenant hits")
    d = report.get("deploy") or {}
    if d.get("old_version_keys_left"):
        broken.append(f"{d['old_version_keys_left']} keys of the retired version left after DONE")
    return broken


def main(out: Path, fast: bool, console: Console) -> None:
    report = run_demo(out, fast, console)
    broken = verdict(report)
    if broken:
        raise StokerError("demo invariants broken: " + "; ".join(broken))
