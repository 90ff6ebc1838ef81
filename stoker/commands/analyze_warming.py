"""`stoker analyze LOG --warming`: what the shipped warming would do on the user's own traffic."""

from __future__ import annotations

import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from stoker.app import console
from stoker.settings import StokerSettings
from stoker.tables import Column, Grid, render

DEFAULT_TTLS = "3h,1d"


def parse_when(value: str | None, option: str) -> datetime | None:
    """An ISO 8601 time (naive = UTC); a clear error names the option."""
    import typer

    if value is None:
        return None
    try:
        t = datetime.fromisoformat(value)
    except ValueError:
        raise typer.BadParameter(
            f"{value!r}: use an ISO 8601 time like 2026-11-09T00:00", param_hint=option
        ) from None
    return t.replace(tzinfo=UTC) if t.tzinfo is None else t.astimezone(UTC)


def run_warming(
    log: Path,
    s: StokerSettings,
    ttls: tuple[int, ...],
    start: datetime | None,
    deploy_at: datetime | None,
    out: Path | None,
    json_out: bool,
) -> None:
    from stoker.warming_replay import Story, analyze_warming, load_log, split_at

    with console.status(f"reading {log.name} ..."):
        loaded = load_log(log)
    begin = split_at(loaded, start)
    columns = (TextColumn("{task.description:<34}"), BarColumn(), TextColumn("{task.percentage:>3.0f}%"),
               TimeElapsedColumn())  # fmt: skip
    with Progress(*columns, console=console, disable=json_out) as progress:
        tasks: dict[str, Any] = {}

        def step(what: str, done: float) -> None:
            if what not in tasks:
                tasks[what] = progress.add_task(what, total=1.0)
            progress.update(tasks[what], completed=min(done, 1.0))

        report = analyze_warming(s, loaded, begin, ttls, Story(deploy_at), step)
    if out is not None:
        from stoker.warming_plots import write_plots

        out.mkdir(parents=True, exist_ok=True)
        (out / "warming.json").write_bytes(orjson.dumps(report, option=orjson.OPT_INDENT_2))
        report["plots"] = [str(p) for p in write_plots(report, out)]
    if json_out:
        sys.stdout.write(orjson.dumps(report, option=orjson.OPT_INDENT_2).decode() + "\n")
        return
    print_report(report)


def print_report(r: dict[str, Any]) -> None:
    h, rp = r["history"], r["replayed"]
    console.print(
        f"learned from {h['requests']:,} requests ({_day(h['from'])} .. {_day(h['to'])}); "
        f"replayed {rp['requests']:,} ({_day(rp['from'])} .. {_day(rp['to'])}) with the "
        "shipped warming and without; exact cache, GPU time as the log gives it",
        highlight=False,
    )
    if r["log"]["bad"]:
        bad = ", ".join(f"{n} {why}" for why, n in r["log"]["bad"].items())
        console.print(f"skipped rows: {bad}", highlight=False)
    for name, f in r["regimes"].items():
        console.print(render(_hour_table(name, f), console.width))
        console.print(render(_summary(name, f), console.width))
    diff = r["settings_not_default"]
    console.print(
        "settings not at their defaults: "
        + (", ".join(f"{k}={v}" for k, v in diff.items()) or "none"),
        highlight=False,
    )
    if r.get("plots"):
        console.print(f"plots: {', '.join(r['plots'])}", highlight=False)


def _hour_table(name: str, f: dict[str, Any]) -> Grid:
    t = Grid(f"{name}: per hour, with warming / without", [Column("hour (UTC)"), *(
        Column(c, "right") for c in ("requests", "hits", "GPU-s", "sends"))])  # fmt: skip
    for row in f["per_hour"]:
        t.add_row(
            row["hour"][5:13].replace("T", " "), f"{row['requests']:,}",
            f"{row['hits']:,} / {row['hits_baseline']:,}",
            f"{row['gpu_s']:,.0f} / {row['gpu_s_baseline']:,.0f}", f"{row['sends']:,}",
        )  # fmt: skip
    return t


def _summary(name: str, f: dict[str, Any]) -> Grid:
    t = Grid(f"{name}: did warming pay", [Column("figure"), Column("value")])
    t.add_row(
        "peak hour GPU-s",
        f"{f['peak_gpu_s']:,.0f} at {_hour(f['peak_hour'])} against {f['peak_gpu_s_baseline']:,.0f}"
        f" at {_hour(f['peak_hour_baseline'])}: {_x(f['peak_gpu_ratio'])}",
    )
    t.add_row(
        "total GPU-s",
        f"{f['total_gpu_s']:,.0f} against {f['total_gpu_s_baseline']:,.0f}: "
        f"{_x(f['total_gpu_ratio'])} (sends {f['warm_gpu_s']:,.0f})",
    )
    per = f["extra_hits_per_send"]
    sends = f"{f['warm_sends']:,}: {f['extra_hits']:,} more hits" + (
        "" if per is None else f" ({per:.2f} a send)"
    )
    t.add_row("warm sends", sends)
    eff = f["warm_efficiency"]
    t.add_row(
        "sends adding a hit",
        f"none expired inside the replay to judge by ({f['warm_sends']:,} sent)"
        if eff is None
        else f"{eff:.0%} of the {f['settled_sends']:,} that expired inside the replay",
    )
    if f.get("peak_gpu_ratio_bound") is not None:
        t.add_row("lowest peak possible", _x(f["peak_gpu_ratio_bound"]))
    t.add_row("hit rate", f"{_pct(f['hit_rate'])} against {_pct(f['hit_rate_baseline'])}")
    if "deploy_prewarm" in f:
        t.add_row("deploy pre-warm", str(f["deploy_prewarm"]))
    t.add_row("replayed in", f"{f['seconds']:.0f} s ({f['scheduler_runs']:,} scheduler runs)")
    return t


def _x(r: float | None) -> str:
    return "-" if r is None else f"{r:.3f}x"


def _pct(r: float | None) -> str:
    return "-" if r is None else f"{100 * r:.1f}%"


def _day(iso: str) -> str:
    return iso[:10]


def _hour(iso: str | None) -> str:
    return "-" if iso is None else iso[5:13].replace("T", " ")
