"""`stoker warm-prefixes`: send the hot prompt prefixes of a model to a backend (or show them).

For a replica that restarted (its KV prefix cache is empty): run it against that replica's URL
once it is ready, e.g. from a Kubernetes postStart hook. A deploy runs it by itself
(STOKER_PREFIX_WARM_ON_DEPLOY) before the hot-set pre-warm.
"""

from __future__ import annotations

from typing import Annotated

import orjson
import typer
from rich.table import Table

from schemas.errors import StokerError
from stoker.app import app, console, examples
from stoker.connect import PrefixBackend, RedisUrl, connected


@app.command(
    "warm-prefixes",
    short_help="Send the hot system prompts to a backend's prefix cache.",
    epilog=examples(
        "stoker warm-prefixes --model llama-3-8b --dry-run",
        "stoker warm-prefixes --model llama-3-8b --backend http://vllm-3:8000/v1",
    ),
)
def warm_prefixes(
    model: Annotated[str, typer.Option(help="model id (as the gateway logs it)")],
    tenant: Annotated[
        list[str] | None, typer.Option(help="only these tenants (repeatable); default all")
    ] = None,
    backend: PrefixBackend = None,
    redis_url: RedisUrl = None,
    qps: Annotated[
        float | None, typer.Option(min=0.01, help="warms a second; default STOKER_PREFIX_WARM_QPS")
    ] = None,
    top: Annotated[
        int | None, typer.Option(min=1, help="prefixes at most; default STOKER_PREFIX_WARM_TOP_N")
    ] = None,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="print the plan; send nothing")
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="one JSON object on stdout")] = False,
) -> None:
    """Warm the backend's KV prefix cache with the model's hottest system prompts: one
    max_tokens=1 request each, at a capped QPS, never through the answer cache."""
    from stoker.stack import Stack

    s = connected(console, redis_url=redis_url)
    # the process's one Stack; its Redis client is released when the verb's process ends
    warmer = Stack(s).prefix_warmer(backend_url=backend, qps=qps, top_n=top, dry_run=dry_run)
    if dry_run:
        room, source = warmer.budget()
        plan = warmer.plan(model, tenant or None, budget=room)
        budget = room.tokens
        if as_json:
            rows = [
                {"tenant": h.tenant, "digest": h.prefix.digest, "count": h.count,
                 "tokens": h.prefix.tokens, "model": h.prefix.model}
                for h in plan
            ]  # fmt: skip
            out = {"model_id": model, "plan": rows, "budget_tokens": budget,
                   "budget_slots": room.slots, "budget_from": source}  # fmt: skip
            print(orjson.dumps(out).decode())
            return
        t = Table(title=f"hot prefixes of {model}")
        for col in ("#", "tenant", "requests", "tokens", "starts with"):
            t.add_column(col)
        for n, h in enumerate(plan, 1):
            head = h.prefix.messages[0][1][:48] if h.prefix.messages else ""
            t.add_row(str(n), h.tenant, f"{h.count:.0f}", str(h.prefix.tokens), head)
        console.print(t)
        console.print(
            f"{len(plan)} prefixes within {budget:,} tokens"
            + (f" and {room.slots} slots" if room.slots else "")
            + f" ({source}); dry run: nothing sent"
        )
        return
    report = warmer.warm(model, tenant or None)
    if as_json:
        print(orjson.dumps(report.__dict__).decode())
    else:
        console.print(str(report))
    if report.failed or report.left_by_deadline or report.skipped:
        raise StokerError(
            f"prefix warm incomplete: {report.failed} failed, {report.left_by_deadline} left, "
            f"{report.skipped} of the coldest skipped to end by the deadline"
        )
