"""`stoker purge`: the staggered purge of a model version, run by hand against Redis and Qdrant."""

from __future__ import annotations

import signal
import threading
from dataclasses import asdict
from typing import Annotated, Any, Final

import orjson
import typer
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from invalidators.purge import PurgeOptions, PurgeProgress, Purger, PurgeSpec
from schemas.errors import StokerError
from stoker.app import app, console, examples
from stoker.connect import QdrantUrl, RedisUrl, connected
from stoker.settings import StokerSettings

# The flags' defaults are PurgeOptions' (the deploy's purge takes the same from the settings).
_DEFAULTS: Final = PurgeOptions()


@app.command(
    short_help="Purge a model version from the caches, paced and resumable.",
    epilog=examples(
        "stoker purge --model llama-3-8b --version 2026-11-01 --dry-run",
        "stoker purge --model llama-3-8b --version 2026-11-01 --retire --rate 20000",
    ),
)
def purge(
    model: Annotated[str, typer.Option("--model", help="model id")],
    version: Annotated[str, typer.Option("--version", help="model version to purge")],
    tenant: Annotated[str | None, typer.Option(help="only this tenant")] = None,
    template: Annotated[str | None, typer.Option(help="only this template version")] = None,
    rate: Annotated[
        float | None, typer.Option(min=1, help="keys/s; unset = as fast as Redis takes it")
    ] = None,
    batch: Annotated[int, typer.Option(min=1, help="keys per UNLINK batch")] = _DEFAULTS.batch,
    delay: Annotated[
        float, typer.Option(min=0, help="extra pause between batches, s")
    ] = _DEFAULTS.delay_s,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="count what would go")] = False,
    retire: Annotated[
        bool, typer.Option(help="retire the version first, so no write of it lands again")
    ] = False,
    restart: Annotated[bool, typer.Option(help="ignore a saved checkpoint")] = False,
    json_out: Annotated[bool, typer.Option("--json", help="print the result as JSON")] = False,
    redis_url: RedisUrl = None,
    qdrant_url: QdrantUrl = None,
) -> None:
    """Delete every exact and negative entry of MODEL@VERSION from every Redis primary (SCAN +
    UNLINK in paced batches, resumable: rerun the same command to continue) and its vectors."""
    if retire and template is not None:
        raise typer.BadParameter("--retire retires a whole version; drop --template")
    s = connected(console, redis_url=redis_url, qdrant_url=qdrant_url)
    purger, semantic_note = _purger(s)
    spec = PurgeSpec(model, version, tenant, template)
    if restart:
        purger.checkpoints.clear(spec.job_id)
    if retire and not dry_run:
        _retire(purger, spec)
    elif not dry_run:
        console.print("[yellow]note[/yellow]: not retired; writes of this version may land again")
    if semantic_note:
        console.print(f"[yellow]note[/yellow]: {semantic_note}")
    opts = PurgeOptions(rate=rate, batch=batch, delay_s=delay, dry_run=dry_run)
    prog = _run_with_bar(purger, spec, opts)
    _report(purger, spec, prog, json_out)
    if prog.state == "interrupted":
        raise StokerError("purge interrupted; run the same command again to resume")


def _purger(s: StokerSettings) -> tuple[Purger, str]:
    """The purger on the process's one Stack (released when the verb's process ends)."""
    from stoker.stack import Stack

    stack = Stack(s)
    if s.semantic_backend == "edge" and s.qdrant_path is None:
        return Purger(stack.redis), "no STOKER_QDRANT_PATH: the semantic store is not purged"
    return Purger(stack.redis, stack.semantic), ""


def _retire(purger: Purger, spec: PurgeSpec) -> None:
    from caches.generations import Generations

    gens = Generations(purger.redis)  # standalone or cluster
    assert spec.model_version is not None
    if spec.tenant is None:
        tenants = gens.retire_model_version(spec.model_id, spec.model_version)
        console.print(f"retired {spec.model_id}@{spec.model_version} in {len(tenants)} tenants")
    else:
        gens.retire_tenant_version(spec.tenant, spec.model_id, spec.model_version)
        console.print(f"retired {spec.model_id}@{spec.model_version} for {spec.tenant}")


def _run_with_bar(purger: Purger, spec: PurgeSpec, opts: PurgeOptions) -> PurgeProgress:
    stop = threading.Event()
    previous = signal.signal(signal.SIGINT, lambda *_: stop.set())  # checkpoint, then stop
    columns = (
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        TextColumn("{task.percentage:>3.0f}% {task.fields[deleted]} keys {task.fields[rate]}"),
        TimeElapsedColumn(),
    )
    try:
        with Progress(*columns, console=console, transient=False) as bar:
            verb = "counting" if opts.dry_run else "purging"
            task = bar.add_task(f"{verb} {spec.pattern}", total=1.0, deleted=0, rate="")

            def show(p: PurgeProgress) -> None:
                n = p.matched if opts.dry_run else p.deleted
                rate = f"{n / p.elapsed_s:,.0f}/s" if p.elapsed_s else ""
                bar.update(task, completed=p.fraction, deleted=f"{n:,}", rate=rate)

            return purger.run(spec, opts, on_progress=show, stop=stop)
    finally:
        signal.signal(signal.SIGINT, previous)


def _report(purger: Purger, spec: PurgeSpec, prog: PurgeProgress, json_out: bool) -> None:
    out: dict[str, Any] = asdict(prog) | {"keys_per_s": round(prog.keys_per_s, 1)}
    if prog.state == "dry-run":
        out["semantic_points"] = purger.semantic_count(spec)
    if json_out:
        typer.echo(orjson.dumps(out).decode())
        return
    if prog.state == "dry-run":
        console.print(
            f"would delete {prog.matched:,} keys and {out['semantic_points']} semantic points"
        )
    else:
        console.print(
            f"{prog.state}: {prog.deleted:,} keys deleted in {prog.elapsed_s:.1f} s "
            f"({prog.keys_per_s:,.0f} keys/s); semantic points deleted: {prog.semantic_deleted}"
        )
