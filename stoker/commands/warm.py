"""`stoker warm`: choose the hot set for a window and warm it (or, with --dry-run, show it)."""

from __future__ import annotations

import dataclasses
import sys
import time
from typing import TYPE_CHECKING, Annotated, Any

import orjson
import typer

from schemas.errors import ConfigError, StokerError
from stoker.app import app, console, examples
from stoker.connect import QdrantUrl, RedisUrl, WarmBackend, connected
from stoker.tables import Column, Grid, render

if TYPE_CHECKING:
    from warmers.hotset.plan import Plan, PlanItem
    from warmers.shadow import WarmSummary

# Rows shown by --dry-run; the rest are counted (a 5k-item plan is for machines, not eyes).
_MAX_ROWS = 50


@app.command(
    short_help="Choose the hot set for a window and warm it (or --dry-run).",
    epilog=examples(
        "stoker warm --dry-run",
        "stoker warm --window 2026-12-07T08:00..2026-12-07T10:00 \\",
        "    --budget-requests 200 --backend http://vllm:8000/v1",
    ),
)
def warm(
    window: Annotated[
        str, typer.Option(help="next-hour, or START..END in ISO 8601 (UTC when naive)")
    ] = "next-hour",
    tenant: Annotated[
        list[str] | None, typer.Option(help="only these tenants (repeatable); default all")
    ] = None,
    budget_requests: Annotated[
        int | None, typer.Option(min=0, help="warm sends; default STOKER_WARM_BUDGET_REQUESTS")
    ] = None,
    budget_gpu_seconds: Annotated[
        float | None, typer.Option(min=0, help="expected GPU-seconds instead of requests")
    ] = None,
    qps: Annotated[
        float | None, typer.Option(min=0.01, help="target QPS; default STOKER_WARM_QPS")
    ] = None,
    backend: WarmBackend = None,
    redis_url: RedisUrl = None,
    qdrant_url: QdrantUrl = None,
    model_version: Annotated[
        str | None, typer.Option(help="namespace to warm; default each query's last version")
    ] = None,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="print the plan; send and write nothing")
    ] = False,
    json_out: Annotated[
        bool,
        typer.Option(
            "--json",
            help="print the whole plan as JSON on stdout: every item and every candidate left "
            "out, with its expected value and why (and the run's counts, unless --dry-run)",
        ),
    ] = False,
) -> None:
    """Plan the hot set for the window (day regimes, paraphrase clusters, the miss a warm
    prevents priced by load, fair budget across tenants) and warm it through the shadow warmer
    at a polite rate.

    A budget named here (--budget-requests, --budget-gpu-seconds) is spent now on the best
    items, down to those asked in the window with a chance under STOKER_WARM_MIN_P_ASKED.
    Without one, the scheduler's own rule applies: what pays for its send and is due now (its
    cheapest hour is the one under way) goes; what is best sent later is listed as deferred."""
    from stoker.stack import Stack
    from stoker.wiring import default_budget
    from warmers.hotset.warm_budget import Budget
    from warmers.hotset.window import Window

    if budget_requests is not None and budget_gpu_seconds is not None:
        raise typer.BadParameter("give one budget, not both", param_hint="--budget-requests")
    try:
        win = Window.parse(window)
    except ConfigError as e:
        raise typer.BadParameter(str(e), param_hint="--window") from None
    s = connected(console, redis_url=redis_url, qdrant_url=qdrant_url)
    named = budget_requests is not None or budget_gpu_seconds is not None
    if budget_requests is not None:
        budget = Budget(requests=budget_requests)
    elif budget_gpu_seconds is not None:
        budget = Budget(gpu_seconds=budget_gpu_seconds)
    else:
        budget = default_budget(s)
    # the process's one Stack: its clients are released when the verb's process ends
    stack = Stack(s)
    runner = stack.runner(qps=qps, backend_url=backend, console=console, dry_run=dry_run)
    console.print(f"planning {win} with a budget of {budget}")
    t0 = time.perf_counter()
    plan = runner.plan(
        win, budget, tenants=tenant or None, model_version=model_version, named=named
    )
    plan_s = time.perf_counter() - t0
    console.print(f"planned in {plan_s:.1f} s")
    _report(plan, table=not json_out, rows=_MAX_ROWS if dry_run else 10)
    out = plan_json(plan) | {"plan_s": round(plan_s, 3)}
    if dry_run:
        console.print("dry run: nothing sent, nothing written")
        if json_out:
            sys.stdout.write(orjson.dumps(out, option=orjson.OPT_INDENT_2).decode() + "\n")
        return
    summary = runner.warm(plan, labels={"by": "stoker warm"})
    _show_summary(summary)
    if json_out:
        out = _with_run(out, plan, summary)
        sys.stdout.write(orjson.dumps(out, option=orjson.OPT_INDENT_2).decode() + "\n")
    if summary.unreachable:
        raise StokerError(f"warm failed: {summary.unreachable}")
    if summary.sent and not summary.cached and summary.failed:
        raise StokerError(f"warm failed: all {summary.failed} sends failed")


def _report(plan: Plan, *, table: bool, rows: int) -> None:
    """The plan on stderr: its table (else, under --json, why budget is unused), and why it
    holds nothing, with what to do next, when it does."""
    if table:
        _show_plan(plan, rows)
    elif plan.unused_reason():
        console.print(f"budget: {plan.unused_reason()}")
    if not plan.items and not plan.deferred:
        console.print(nothing_to_warm(plan))


def _show_plan(plan: Plan, rows: int) -> None:
    """The plan's best items as a table that fits the terminal, every word whole (hits:
    expected in the window; p: the chance the entry is asked; send: the hour it goes out in,
    UTC): the reasons are a column of their own when it is wide (120 columns or more), and
    always in --json."""
    wide = console.width >= 120
    columns = [Column("#", "right"), Column("tenant"), Column("query"), Column("hits", "right"),
               Column("p", "right"), Column("send"), *([Column("why chosen")] if wide else [])]  # fmt: skip
    t = Grid(f"hot set for {plan.window}", columns)
    for n, i in enumerate(plan.items[:rows], 1):
        send = plan.send_at(i)
        cells = [
            str(n), i.tenant, i.query, f"{i.expected_hits:.1f}",
            "-" if i.p_asked is None else f"{i.p_asked:.2f}",
            "now" if send is None else f"{send:%H:%M}",
        ]  # fmt: skip
        t.add_row(*cells, *([i.reason] if wide else []))
    if plan.items:  # an empty table says nothing; the lines below say why
        console.print(render(t, console.width))
    if len(plan.items) > rows:
        console.print(f"... and {len(plan.items) - rows} more")
    if not wide and plan.items:
        console.print("why each was chosen: --json, or a terminal of 120 columns")
    shares = ", ".join(f"{t} {v:.1f}" for t, v in plan.shares.items())
    skipped: dict[str, int] = {}
    for sk in plan.skipped:
        why = sk.reason.split(" (")[0]
        skipped[why] = skipped.get(why, 0) + 1
    console.print(
        f"{len(plan.items)} items, {plan.spent:.1f} of {plan.budget} "
        f"(fair shares: {shares or 'none'}); expected GPU-seconds saved "
        f"{plan.expected_gpu_s_saved:.1f}; left out: {_fmt(skipped) or 'none'}"
    )
    if plan.deferred:
        hours: dict[str, int] = {}
        for i in plan.deferred:
            at = plan.send_at(i)
            key = "later" if at is None else f"{at:%H:%M}"
            hours[key] = hours.get(key, 0) + 1
        when = ", ".join(f"{n} at {h}" for h, n in sorted(hours.items()))
        console.print(
            f"deferred: {len(plan.deferred)} items are cheaper to send later ({when} UTC); the "
            "scheduler sends them then"
        )
    if plan.unused_reason():
        console.print(f"budget: {plan.unused_reason()}")
    for ns, note in plan.regimes.items():
        console.print(f"  {ns}: draws on {note}")
    for tenant, note in plan.calibration.items():
        console.print(f"  {tenant}: {note}")


def nothing_to_warm(plan: Plan) -> str:
    """Why a plan holds nothing, and what to do next, in one line (the counts of what was left
    out are on the budget's line above it)."""
    if plan.expected_volume <= 0:
        return (
            "nothing to warm: the traffic profile holds no request of the window's hours on the "
            "days before today (it forecasts by hour of the week); replay a log of past days "
            "(stoker replay LOG; stoker sample-log --gateway writes one), or let a day of "
            "traffic pass"
        )
    if plan.named or not any(sk.reason.startswith("below break-even") for sk in plan.skipped):
        return "nothing to warm: --json lists every candidate with why it was left out"
    return (
        "nothing to warm now: a warm pays only where it is sent cheaper than the hours it "
        "serves, and none does in this window; name a budget to warm the most asked anyway "
        "(--budget-requests 10), or plan a busier window (--window START..END)"
    )


def plan_json(plan: Plan) -> dict[str, Any]:
    """The whole plan: every item and every candidate left out, with its value and reason."""

    def item(i: PlanItem) -> dict[str, Any]:
        send = plan.send_at(i)
        return {
            "tenant": i.tenant, "model_id": i.model_id, "model_version": i.model_version,
            "template_version": i.template_version, "query": i.query,
            "cluster_size": i.cluster_size, "expected_hits": round(i.expected_hits, 4),
            "miss_cost_ms": round(i.miss_cost_ms, 1), "warm_cost_ms": round(i.warm_cost_ms, 1),
            "miss_latency_ms": _round(i.miss_latency_ms, 1),
            "value_ms": round(i.value_ms, 1), "kept": i.reason,
            # valued by the miss it prevents (STOKER_WARM_VALUE_MODEL=prevented), else null
            "p_asked": _round(i.p_asked, 4), "price_send": _round(i.price_send, 4),
            "price_window": _round(i.price_window, 4),
            "send_at": None if send is None else send.isoformat(),
        }  # fmt: skip

    return {
        "window": {"start": plan.window.start.isoformat(), "end": plan.window.end.isoformat()},
        "budget": str(plan.budget),
        "spent": round(plan.spent, 3),
        "unused": round(plan.unused, 3),
        "unused_reason": plan.unused_reason(),
        "expected_gpu_s_saved": round(plan.expected_gpu_s_saved, 3),
        "shares": plan.shares,
        "regimes": plan.regimes,
        "calibration": plan.calibration,
        "named_budget": plan.named,
        "items": [item(i) for i in plan.items],
        # worth sending, but cheaper later: the scheduler sends them in their hour
        "deferred": [item(i) for i in plan.deferred],
        "left_out": [
            {
                "tenant": sk.tenant, "query": sk.query, "reason": sk.reason,
                "expected_hits": None if sk.expected_hits is None else round(sk.expected_hits, 4),
                "value_ms": None if sk.value_ms is None else round(sk.value_ms, 1),
            }
            for sk in plan.skipped
        ],
    }  # fmt: skip


def _with_run(out: dict[str, Any], plan: Plan, summary: WarmSummary) -> dict[str, Any]:
    """The plan's JSON with the run's counts, and each item marked `landed` when its answer
    is cached now (an answer cut by max_tokens is not)."""
    landed = set(summary.landed_keys)
    for i, o in zip(plan.items, out["items"], strict=True):
        o["landed"] = i.item.identity.key().exact() in landed
    run = {k: v for k, v in dataclasses.asdict(summary).items() if k != "send_times"}
    return out | {"run": run}


def _show_summary(s: WarmSummary) -> None:
    console.print(
        f"sent {s.sent}, cached {s.cached}, skipped {s.skipped_cached} cached + "
        f"{s.skipped_uncacheable} uncacheable + {s.skipped_negative} recently failed + "
        f"{s.skipped_priced} priced out by the backend's load, "
        f"failed {s.failed} ({s.overloaded} overloaded), refused as stale {s.refused_stale}, "
        f"GPU-seconds {s.gpu_seconds:.1f}, {s.achieved_qps:.1f} QPS over {s.elapsed_s:.1f} s"
    )
    if s.not_stored:
        cut = "length" in s.not_stored_reason
        hint = "; a larger max_tokens lets a long answer end on its own" if cut else ""
        console.print(
            f"answered but not stored: {s.not_stored} (first: {s.not_stored_reason}){hint}"
        )


def _round(x: float | None, digits: int) -> float | None:
    return None if x is None else round(x, digits)


def _fmt(counts: dict[str, Any]) -> str:
    return ", ".join(f"{v} {k}" for k, v in sorted(counts.items()))
