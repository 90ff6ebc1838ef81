"""`stoker analyze LOG`: measure before you build (duplicates, simulated hit rates, advice)."""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Annotated, Any

import orjson
import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from audits.whatif.options import WhatIfOptions
from stoker.app import app, console, examples
from stoker.connect import RedisUrl, connected
from stoker.settings import StokerSettings
from stoker.tables import Column, Grid, render

_UNITS = {"s": 1, "m": 60, "h": 3_600, "d": 86_400, "w": 7 * 86_400}
_TTL = re.compile(r"^(\d+)([smhdw]?)$")


def parse_thresholds(value: str) -> tuple[float, ...]:
    try:
        out = tuple(sorted({float(v) for v in value.split(",") if v.strip()}))
    except ValueError:
        raise typer.BadParameter(f"{value!r}: use numbers like 0.85,0.92") from None
    if not out or not all(0.0 < t <= 1.0 for t in out):
        raise typer.BadParameter(f"{value!r}: each threshold must lie in (0, 1]")
    return out


def parse_ttls(value: str) -> tuple[int, ...]:
    out: set[int] = set()
    for part in (v.strip().lower() for v in value.split(",") if v.strip()):
        m = _TTL.match(part)
        if m is None or int(m.group(1)) == 0:
            raise typer.BadParameter(f"{part!r}: use a positive duration like 90s, 30m, 6h, 7d")
        out.add(int(m.group(1)) * _UNITS[m.group(2) or "s"])
    if not out:
        raise typer.BadParameter(f"{value!r}: give at least one TTL")
    return tuple(sorted(out))


def fmt_ttl(seconds: int) -> str:
    for unit in ("d", "h", "m"):  # "7d", not "1w": as users write TTLs
        if seconds % _UNITS[unit] == 0:
            return f"{seconds // _UNITS[unit]}{unit}"
    return f"{seconds}s"


_EMBED_BUDGET = WhatIfOptions().embed_budget  # the help's default: the setting's


@app.command(
    short_help="What caching would buy on a request log, before you build.",
    epilog=examples(
        "stoker analyze requests.jsonl",
        "stoker analyze requests.parquet --labels intent --ttls 1h,24h --json",
        "stoker analyze requests.parquet --warming --out out/warming",
    ),
)
def analyze(
    log: Annotated[Path, typer.Argument(help="request log: .jsonl, .csv or .parquet")],
    json_out: Annotated[
        bool, typer.Option("--json", help="print one JSON document to stdout, no tables")
    ] = False,
    labels: Annotated[
        str | None,
        typer.Option(help="column of true labels (e.g. intent); used only to score false hits"),
    ] = None,
    thresholds: Annotated[
        str, typer.Option(metavar="T,T,...", help="cosine thresholds to try, comma-separated")
    ] = "0.85,0.88,0.90,0.92,0.95,0.98",
    ttls: Annotated[
        str | None,
        typer.Option(
            metavar="TTL,TTL,...",
            help="entry TTLs to try: 90s, 30m, 6h, 7d (default 1h,6h,24h,7d; with --warming 3h,1d)",
        ),
    ] = None,
    max_false_share: Annotated[
        float, typer.Option(min=0.0, max=1.0, help="with --labels: wrong answers tolerated")
    ] = 0.01,
    embed_budget: Annotated[
        int | None,
        typer.Option(
            min=1,
            help="distinct prompts embedded at most; past it, estimate on a sample with 95% "
            f"intervals (default: STOKER_ANALYZE_EMBED_BUDGET, {_EMBED_BUDGET})",
        ),
    ] = None,
    sample: Annotated[
        bool, typer.Option(help="--no-sample: embed every distinct prompt, whatever the budget")
    ] = True,
    embed_cache: Annotated[
        bool,
        typer.Option(help="keep embeddings in Redis (the embedding cache), if one is set"),
    ] = True,
    redis_url: RedisUrl = None,
    warming: Annotated[
        bool,
        typer.Option(
            "--warming",
            help="replay the log after --from through the shipped warming (planner, "
            "scheduler, pacing) against a simulated cache, with warming and without",
        ),
    ] = False,
    start: Annotated[
        str | None,
        typer.Option(
            "--from",
            help="with --warming: learn before this time, replay after it (ISO 8601, "
            "UTC; default: all but the log's last 7 days)",
        ),
    ] = None,
    deploy_at: Annotated[
        str | None,
        typer.Option(help="with --warming: a model deploy at this time (ISO 8601, UTC)"),
    ] = None,
    out: Annotated[
        Path | None, typer.Option(help="with --warming: folder for warming.json and plots")
    ] = None,
) -> None:
    """What caching would buy on LOG: duplicate rates, hit rate and GPU time saved per threshold
    and TTL (a simulated cache in time order), a recommendation and a verdict.

    --warming: what the shipped warming would do on LOG. The log before --from fills the
    traffic profile; the rest is replayed in virtual time through the planner, the scheduler,
    the headroom and the pacing, with the settings' defaults (each --ttls TTL in turn),
    against an exact cache and a model server priced from the log's own gpu_ms, and once
    more without warming. Per hour: requests, hits, GPU-seconds and warm sends; then the peak
    hour, the totals and the hits each warm send added."""
    from audits.whatif.keyed_log import UnreadableLog, key_frame, read_frame
    from audits.whatif.report import Settings
    from schemas.errors import UsageError

    if warming:
        from stoker.commands.analyze_warming import DEFAULT_TTLS, parse_when, run_warming

        if labels is not None:
            raise typer.BadParameter("scores semantic hits, not warming", param_hint="--labels")
        when = parse_when(start, "--from")
        deploy = parse_when(deploy_at, "--deploy-at")
        # the settings as the workers read them; the replay's Redis is a private one
        s = StokerSettings()
        run_warming(log, s, parse_ttls(ttls or DEFAULT_TTLS), when, deploy, out, json_out)
        return
    for name, given in (("--from", start), ("--deploy-at", deploy_at), ("--out", out)):
        if given is not None:
            raise typer.BadParameter("goes with --warming", param_hint=name)
    s = connected(console, redis_url=redis_url)
    budget = (embed_budget or s.options(WhatIfOptions).embed_budget) if sample else None
    settings = Settings(
        parse_thresholds(thresholds), parse_ttls(ttls or "1h,6h,24h,7d"), labels,
        max_false_share, budget,
    )  # fmt: skip
    try:  # a log that cannot be read is bad input: exit 2, as `stoker replay` does
        frame = read_frame(log)
        if labels is not None and labels not in frame.columns:
            raise typer.BadParameter(f"no column {labels!r} in {log.name}", param_hint="--labels")
        # keyed before the embedder loads (seconds), so a bad log fails fast
        keyed = key_frame(frame, labels)
        report = _run(keyed, settings, s, embed_cache, show_progress=not json_out)
    except UnreadableLog as e:
        raise UsageError(str(e)) from e
    if json_out:
        sys.stdout.write(orjson.dumps(report, option=orjson.OPT_INDENT_2).decode() + "\n")
    else:
        _print_report(report)


def _run(
    frame: Any, settings: Any, s: StokerSettings, cache: bool, show_progress: bool
) -> dict[str, Any]:
    from audits.whatif.report import analyze as run_analysis
    from caches.embedders import EmbedderOptions, SentenceTransformerEmbedder
    from stoker.modelserver import cache_root

    with console.status("loading the embedder ..."):
        # the settings' model and engine, as the gateway's: its thresholds are the ones served
        local = SentenceTransformerEmbedder.from_options(
            s.options(EmbedderOptions), cache_root(s.model_cache_dir)
        )
        embedder = _cached(local, s) if cache else local
    columns = (TextColumn("{task.description:<18}"), BarColumn(), MofNCompleteColumn(),
               TimeElapsedColumn())  # fmt: skip
    with Progress(*columns, console=console, disable=not show_progress) as progress:
        tasks = {
            "embed": progress.add_task("embed prompts", total=None),
            "simulate": progress.add_task("simulate caches", total=None),
        }

        def on_progress(stage: str, done: int, total: int) -> None:
            progress.update(tasks[stage], completed=done, total=total)

        return run_analysis(frame, settings, embedder, on_progress)


def _cached(embedder: Any, s: StokerSettings) -> Any:
    """The embedder behind the embedding cache, when there is a Redis to hold it: a second
    analyze of the same (or an overlapping) log embeds only the prompts it has not seen."""
    if not s.redis_url:
        return embedder
    from audits.whatif.neighbours import ScopedEmbedder
    from caches.embedding_cache import CachedEmbedder
    from stoker.stack import Stack

    # the verb's one Redis client, released when the process ends
    return ScopedEmbedder(CachedEmbedder(embedder, Stack(s).redis, s.embedding_ttl_s))


def _pct(x: float | None, digits: int = 1) -> str:
    return "-" if x is None else f"{100 * x:.{digits}f}%"


def _print_report(r: dict[str, Any]) -> None:
    lg = r["log"]
    console.print(
        f"[bold]{lg['requests']:,}[/bold] requests ({lg['bad_rows']:,} bad rows skipped), "
        f"{len(lg['tenants'])} tenants, {lg['unique_keys']:,} distinct keys, "
        f"{lg['from']} .. {lg['to']}"
    )
    smp = r["sample"]
    if smp["sampled"]:
        console.print(
            f"[bold]estimated on a sample[/bold]: {smp['embedded_prompts']:,} of "
            f"{smp['distinct_prompts']:,} distinct prompts embedded (the {smp['head_prompts']:,} "
            f"of the most asked families of near duplicates, and {100 * smp['tail_rate']:.1f}% "
            "of the other families, whole); hit rates with their 95% interval"
        )
    for grid in (_dup_table(r), _grid_table(r), _tenant_table(r)):
        console.print(render(grid, console.width))
    rec, v = r["recommendation"], r["verdict"]
    thr = "exact only" if rec["threshold"] is None else f"{rec['threshold']:.2f}"
    console.print(f"[bold]recommended:[/bold] threshold {thr}, TTL {fmt_ttl(rec['ttl_s'])} "
                  f"({rec['reason']})")  # fmt: skip
    colour = "green" if v["worth_caching"] else "yellow"
    console.print(f"[bold {colour}]verdict:[/bold {colour}] {v['text']}")


def _by_tenant(*numbers: str) -> list[Column]:
    return [Column("tenant"), *(Column(n, "right") for n in numbers)]


def _dup_table(r: dict[str, Any]) -> Grid:
    near = [f"near ≥{thr:.2f}" for thr in r["settings"]["thresholds"]]
    t = Grid("duplicates (against every earlier request, no TTL)",
             _by_tenant("requests", "uncacheable", "exact dup", *near))  # fmt: skip
    d = r["duplicates"]
    for name, s in [*d["tenants"].items(), ("overall", d["overall"])]:
        near = [_pct(n["near_dup_rate"]) for n in s["near_dup"]]
        t.add_row(name, f"{s['requests']:,}", _pct(s["uncacheable_rate"]),
                  _pct(s["exact_dup_rate"]), *near)  # fmt: skip
    return t


def _grid_table(r: dict[str, Any]) -> Grid:
    labelled = r["settings"]["labels"] is not None
    what = "hit rate / GPU saved" + (" / false hits" if labelled else "")
    ttls = [Column(f"TTL {fmt_ttl(ttl)}", "right") for ttl in r["settings"]["ttls_s"]]
    t = Grid(f"simulated cache, all tenants: {what}", [Column("threshold"), *ttls])
    rows: dict[Any, list[str]] = {}
    for g in r["simulation"]:
        o = g["overall"]
        lo, hi = o["hit_rate_total_ci"]
        spread = f" ({100 * lo:.1f}-{100 * hi:.1f})" if hi > lo else ""
        cell = f"{_pct(o['hit_rate_total'])}{spread} / {o['gpu_seconds_saved_pct']:.1f}%"
        if labelled:
            cell += f" / {_pct(o['false_hit_share'], 2)}"
        rows.setdefault(g["threshold"], []).append(cell)
    for thr, cells in rows.items():
        t.add_row("exact only" if thr is None else f"{thr:.2f}", *cells)
    return t


def _tenant_table(r: dict[str, Any]) -> Grid:
    rec = r["recommendation"]
    at = (rec["threshold"], rec["ttl_s"])
    g = next(g for g in r["simulation"] if (g["threshold"], g["ttl_s"]) == at)
    t = Grid("per tenant at the recommended settings",
             _by_tenant("exact", "semantic", "total", "GPU s saved", "GPU saved", "false hits"))  # fmt: skip
    for name, s in [*g["tenants"].items(), ("overall", g["overall"])]:
        t.add_row(
            name,
            _pct(s["hit_rate_exact"]),
            _pct(s["hit_rate_semantic"]),
            _pct(s["hit_rate_total"]),
            f"{s['gpu_seconds_saved']:,.0f}",
            f"{s['gpu_seconds_saved_pct']:.1f}%",
            _pct(s["false_hit_share"], 2),
        )
    return t
