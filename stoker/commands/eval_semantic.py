"""`stoker eval-semantic`: served-answer correctness of the static curve and the verified matcher,
on CLINC150 or any labelled CSV (issue 15; protocol in stoker/semantic_eval.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import orjson
import typer
from rich.table import Table

from schemas.errors import UsageError
from stoker.app import app, console, examples


@app.command(
    "eval-semantic",
    short_help="How often semantic hits are right: static threshold vs verified.",
    epilog=examples(
        "stoker eval-semantic --limit 2000",
        "stoker eval-semantic --data mine.csv --text-col question --label-col intent",
    ),
)
def eval_semantic(
    json_out: Annotated[bool, typer.Option("--json", help="one JSON object per line")] = False,
    data: Annotated[
        Path | None, typer.Option(help="a labelled CSV; default CLINC150 test + oos_test")
    ] = None,
    text_col: Annotated[str, typer.Option(help="the CSV's text column")] = "text",
    label_col: Annotated[str, typer.Option(help="the CSV's label column (scoring only)")] = "label",
    oos_label: Annotated[str, typer.Option(help="the label of out-of-scope rows")] = "oos",
    history: Annotated[
        Path | None,
        typer.Option(
            help="earlier traffic (a CSV with the same columns): the budget's verdicts carry "
            "over from it; default for CLINC150: val + oos_val"
        ),
    ] = None,
    history_share: Annotated[
        float,
        typer.Option(
            min=0.0,
            max=0.9,
            help="with --data and no --history: this share of the shuffled "
            "rows is the earlier traffic (not scored)",
        ),
    ] = 0.0,
    cold: Annotated[
        bool, typer.Option("--cold", help="no earlier traffic: the budget starts with no verdict")
    ] = False,
    limit: Annotated[int, typer.Option(min=0, help="queries to stream; 0 = all")] = 0,
    seed: Annotated[int, typer.Option(help="shuffle seed of the queries")] = 7,
    max_wrong_rate: Annotated[
        float, typer.Option(min=0.0001, max=0.5, help="the error budget's delta")
    ] = 0.01,
    only: Annotated[
        str, typer.Option(help="comma-separated configuration names; empty = all")
    ] = "",
) -> None:
    """Stream labelled queries through the semantic cache (Qdrant Edge, all-MiniLM-L6-v2) under
    the static curve and the verified matcher, with a simulated backend that words every answer
    anew. Labels only score; matchers see prompts, vectors and the backend's answers."""
    from caches.embedders import SentenceTransformerEmbedder
    from stoker.semantic_eval import Pairs, evaluate, load_clinc, load_csv, split_history

    if cold and (history is not None or history_share):
        raise UsageError("--cold takes no --history or --history-share")
    if history is not None and history_share:
        raise UsageError("--history and --history-share both name the earlier traffic: give one")
    if data is None:
        if history_share:
            raise UsageError("--history-share splits --data; CLINC150's earlier traffic is val")
        load_clinc()  # UsageError (exit 2) with the path when the data is absent or unreadable
        earlier: Pairs | None = [] if cold else None
        rows = None
    else:
        rows = load_csv(data, text_col, label_col)  # UsageError (exit 2) for a bad file
        rows, earlier = split_history(rows, history_share, seed)
    if history is not None:
        earlier = load_csv(history, text_col, label_col)
    names = [n for n in only.split(",") if n] or None
    with console.status("evaluating") as status:
        ev = evaluate(
            SentenceTransformerEmbedder(),
            seed=seed,
            limit=limit or None,
            names=names,
            rows=rows,
            history=earlier,
            oos_label=oos_label,
            max_wrong_rate=max_wrong_rate,
            progress=lambda m: status.update(m),
        )
    rows_out = [r.as_dict() for r in ev.rows]
    summary = ev.summary() if {"stoker", "static_0.92"} <= {r.name for r in ev.rows} else None
    young = ev.cold_summary() if summary and (cold or summary["history_queries"]) else None
    if json_out:
        for line in [*rows_out, *([summary] if summary else []), *([young] if young else [])]:
            typer.echo(orjson.dumps(line).decode())
        return
    _table(rows_out)
    if young:
        console.print(
            f"started cold, first {young['queries']} queries: {young['hits']} hits "
            f"({young['hit_rate']:.1%}) at {young['wrong_share']:.2%} wrong against static "
            f"0.92's {young['static092_hits']} at {young['static092_wrong_share']:.2%} "
            f"({young['ratio']:.2f}x); the answers are the simulator's (it knows each query's "
            f"intent), the prompt-only bound served {young['prompt_only_hits']}"
        )
    if summary:
        warm = summary["history_queries"]
        if warm:
            console.print(
                f"budget verdicts carried over from {warm} earlier queries; started cold "
                f"instead: {summary['cold_ratio']:.2f}x static 0.92's hits at "
                f"{summary['cold_wrong_share']:.2%} wrong"
            )
        console.print(
            f"verified: {summary['ratio']:.2f}x the hit rate of static 0.92, wrong share "
            f"{summary['wrong_share']:.2%} vs {summary['static092_wrong_share']:.2%}; monitor "
            f"bound {summary['monitor_bound']:.2%} (true {summary['true_wrong']:.2%}); "
            f"verification adds p50 {summary['verification_ms_p50']:.2f} ms, "
            f"p99 {summary['verification_ms_p99']:.2f} ms; embedding {ev.embed_seconds:.0f} s"
        )


def _table(rows: list[dict[str, Any]]) -> None:
    t = Table(title="semantic cache: hit rate and wrong share per configuration")
    for col in ("configuration", "hit rate", "wrong share", "oos hit rate", "ceiling", "guarded"):
        t.add_column(col, justify="left" if col == "configuration" else "right")
    for r in rows:
        t.add_row(
            r["name"],
            f"{r['hit_rate']:.1%}",
            f"{r['wrong_share']:.2%}",
            f"{r['oos_hit_rate']:.1%}",
            f"{r['ceiling']:.1%}",
            str(sum(r.get("rejected_by_guard", {}).values())),
        )
    console.print(t)
