"""`stoker demo`: the main job on the embedded stack."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from schemas.errors import StokerError
from stoker.app import app, console, examples


@app.command(
    short_help="The main job on the embedded stack, with a report and plots.",
    epilog=examples("stoker demo --out out/demo", "stoker demo --fast"),
)
def demo(
    out: Annotated[Path, typer.Option(help="folder for report.json and plots")] = Path("out/demo"),
    fast: Annotated[
        bool,
        typer.Option(help="36 hours of a third of the traffic: 5-7 min on 2 shared cores"),
    ] = False,
) -> None:
    """The main job: two weeks of traffic through the embedded stack, with and without warming.

    Week 1 trains the traffic profile; week 2 is served with warming and without, in two TTL
    regimes (1 day, 3 hours), with a model deploy and knowledge-base changes, against the
    simulated GPU backend. It prints one headline and table per regime and writes report.json
    and plots to --out. Measured on 2 cores shared with other work: about 40 min at a load of
    7-8, --fast 5-7 min at 4-7. Off a terminal it prints a progress line every 5 s.
    """
    # the demo's modules take seconds to import on a busy machine: say something first
    console.print("stoker demo: starting (embedded stack, simulated GPU backend)", highlight=False)
    from stoker.demo.main import main

    main(out, fast, console)


@app.command(
    short_help="A 15-second check of the embedded stack.",
    epilog=examples("stoker smoke --out out/smoke"),
)
def smoke(
    out: Annotated[Path, typer.Option(help="folder for report.json")] = Path("out/smoke"),
) -> None:
    """A 15-second check of the embedded stack: Kafka, DLQ, exact + semantic cache, invalidation."""
    from stoker.smoke import run_smoke

    report = run_smoke(out, console)
    broken = []
    if report.cross_tenant_hits:
        broken.append(f"{report.cross_tenant_hits} cross-tenant hits")
    if report.hits_after_invalidation:
        broken.append(
            f"{report.hits_after_invalidation} hits served after their doc was invalidated"
        )
    if report.stale_writes_refused != 1:
        broken.append("a write begun before the invalidation landed")
    if broken:
        raise StokerError("invariants broken: " + "; ".join(broken))


@app.command(epilog=examples("stoker version"))
def version() -> None:
    """Print stoker's version."""
    from importlib.metadata import version as v

    typer.echo(v("stoker"))
