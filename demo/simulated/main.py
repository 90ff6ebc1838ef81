"""`stoker demo --simulated` (and `--fast`): the story, its report, its plots; `--seeds N` replays
the sample log's spec made with N seeds and gives each regime's figures as mean and spread."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
from rich.console import Console

from demo.progress import DemoProgress
from demo.simulated.story import Scenario, run_story
from stoker.data import SAMPLE_LOG
from stoker.tables import Column, Grid, render

# The figures each regime gives over seeds (mean, sd, min, max)
FIGURES = ("peak_gpu_ratio", "total_gpu_ratio", "warm_efficiency", "hit_rate", "hit_rate_baseline")
SOURCE = (
    "the sample log's week 2 replayed in virtual time through `stoker analyze --warming` "
    "(exact cache, GPU time as the log gives it), with the shipped warming and without"
)


def run_demo(out: Path, sc: Scenario, console: Console) -> dict[str, Any]:
    from stoker.warming_plots import write_plots

    with DemoProgress(console) as bar:
        bar.phase(f"replaying {sc.hours} hours of week 2 in two TTL regimes")
        tasks: dict[str, Any] = {}

        def step(what: str, done: float) -> None:
            if what not in tasks:
                tasks[what] = bar.add_task(what, total=1.0)
            bar.update(tasks[what], completed=min(done, 1.0))

        report = run_story(sc, progress=step)
    out.mkdir(parents=True, exist_ok=True)
    report["plots"] = [str(p) for p in write_plots(report, out)]
    (out / "report.json").write_bytes(orjson.dumps(report, option=orjson.OPT_INDENT_2))
    print_report(report, console)
    console.print(f"report: {out / 'report.json'}; plots: {', '.join(report['plots'])}",
                  highlight=False)  # fmt: skip
    return report


def print_report(r: dict[str, Any], console: Console) -> None:
    console.print(f"[bold]stoker demo --simulated[/bold]: {SOURCE}", highlight=False)
    deploy = r["deploy_at"] or "none"
    console.print(
        f"learned from {r['history']['requests']:,} requests of week 1; replayed "
        f"{r['replayed']['requests']:,}; deploy at {deploy}; {len(r['kb_changes'])} "
        "knowledge-base changes",
        highlight=False,
    )
    t = Grid("with warming / without", [Column("regime"), *(Column(c, "right") for c in (
        "peak GPU-s", "total GPU-s", "hit rate", "sends", "added a hit"))])  # fmt: skip
    for name, f in r["regimes"].items():
        eff = f["warm_efficiency"]
        t.add_row(
            name,
            f"{f['peak_gpu_s']:,.0f} / {f['peak_gpu_s_baseline']:,.0f}",
            f"{f['total_gpu_s']:,.0f} / {f['total_gpu_s_baseline']:,.0f}",
            f"{100 * f['hit_rate']:.1f}% / {100 * f['hit_rate_baseline']:.1f}%",
            f"{f['warm_sends']:,}",
            "-" if eff is None else f"{eff:.0%}",
        )
    console.print(render(t, console.width))
    for f in r["regimes"].values():
        console.print(f["headline"], highlight=False)
        if "deploy_prewarm" in f:
            console.print(f"  deploy: {f['deploy_prewarm']}", highlight=False)


def main(out: Path, fast: bool, console: Console, seeds: int = 1) -> None:
    sc = Scenario.fast() if fast else Scenario()
    if seeds <= 1:
        run_demo(out, sc, console)
        return
    from demo.seeds import over_seeds
    from simulation.logs.sample import SampleSpec, generate, write

    reports = []
    for i in range(seeds):
        log = SAMPLE_LOG if i == 0 else out / f"seed-{i}" / "log.parquet"
        if i:
            spec = SampleSpec(seed=SampleSpec().seed + i)
            write(generate(spec), log, spec)
        console.print(f"seed {i + 1} of {seeds}: {log}", highlight=False)
        reports.append(run_demo(out / f"seed-{i}", sc.with_log(log), console))
    spread = over_seeds(reports, FIGURES)
    first = reports[0] | {"over_seeds": spread}
    (out / "report.json").write_bytes(orjson.dumps(first, option=orjson.OPT_INDENT_2))
    for name, figures in spread.items():
        line = ", ".join(
            f"{k} {v['mean']:.3f} ({v['min']:.3f}-{v['max']:.3f})"
            for k, v in figures.items()
            if v is not None
        )
        console.print(f"{name} over {seeds} seeds: {line}", highlight=False)
