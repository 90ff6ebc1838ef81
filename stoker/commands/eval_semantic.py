"""`stoker eval-semantic`: served-answer correctness of each matcher on CLINC150 (issue 8)."""

from __future__ import annotations

from typing import Annotated, Any

import orjson
import typer
from rich.table import Table

from stoker.app import app, console


@app.command("eval-semantic")
def eval_semantic(
    json_out: Annotated[bool, typer.Option("--json", help="one JSON object per line")] = False,
    limit: Annotated[int, typer.Option(min=0, help="queries to stream; 0 = all 5,500")] = 0,
    seed: Annotated[int, typer.Option(help="shuffle seed of queries and warmer traffic")] = 7,
    bank: Annotated[
        int, typer.Option(min=0, help="warmer prompts answered by the simulated backend")
    ] = 6000,
    only: Annotated[
        str, typer.Option(help="comma-separated configuration names; empty = all")
    ] = "",
) -> None:
    """Stream CLINC150 test + oos_test through the semantic cache (Qdrant Edge, all-MiniLM-L6-v2)
    under each matcher and report hit rate, wrong share, out-of-scope hit rate and ceiling.
    Labels only score; matchers see prompts, vectors and the backend's answers."""
    from caches.embedders import SentenceTransformerEmbedder
    from stoker.semantic_eval import evaluate, load_clinc

    data = load_clinc()  # UsageError (exit 2) with the path when the data is absent or unreadable
    names = [n for n in only.split(",") if n] or None
    with console.status("evaluating") as status:
        ev = evaluate(
            SentenceTransformerEmbedder(),
            seed=seed,
            limit=limit or None,
            bank_size=bank,
            names=names,
            data=data,
            progress=lambda m: status.update(m),
        )
    rows = [r.as_dict() for r in ev.rows]
    summary = ev.summary() if {"stoker", "static_0.92"} <= {r.name for r in ev.rows} else None
    if json_out:
        for line in [*rows, *([summary] if summary else [])]:
            typer.echo(orjson.dumps(line).decode())
        return
    _table(rows)
    if summary:
        verdict = "ok" if summary["wrong_share_ok"] else "[red]wrong share above static 0.92[/red]"
        console.print(
            f"stoker: {summary['ratio']:.2f}x the hit rate of static 0.92, wrong share "
            f"{summary['wrong_share']:.2%} vs {summary['static092_wrong_share']:.2%} ({verdict}); "
            f"embedding {ev.embed_seconds:.0f} s, bank {ev.bank_size} answered prompts"
        )


def _table(rows: list[dict[str, Any]]) -> None:
    t = Table(title="semantic cache on CLINC150 (test + oos_test)")
    for col in ("configuration", "hit rate", "wrong share", "oos hit rate", "ceiling", "guarded"):
        t.add_column(col, justify="left" if col == "configuration" else "right")
    for r in rows:
        t.add_row(
            r["name"],
            f"{r['hit_rate']:.1%}",
            f"{r['wrong_share']:.2%}",
            f"{r['oos_hit_rate']:.1%}",
            f"{r['ceiling']:.1%}",
            str(sum(r["rejected_by_guard"].values())),
        )
    console.print(t)
