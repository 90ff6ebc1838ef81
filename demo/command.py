"""`stoker demo`: the main job on the embedded stack, on the real model or the simulated one."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from schemas.errors import StokerError
from stoker.app import app, console, examples


@app.command(
    short_help="The main job on the embedded stack and the real model, with a report and plots.",
    epilog=examples(
        "stoker demo --out out/demo", "stoker demo --simulated", "stoker demo --simulated --fast"
    ),
)
def demo(
    out: Annotated[Path, typer.Option(help="folder for report.json and plots")] = Path("out/demo"),
    simulated: Annotated[
        bool,
        typer.Option("--simulated", help="week 2 replayed with and without warming instead"),
    ] = False,
    fast: Annotated[
        bool,
        typer.Option(help="--simulated on two days of week 2: about 3 min"),
    ] = False,
    seeds: Annotated[
        int,
        typer.Option(
            min=1,
            max=10,
            help="--simulated this many times: each regime's figures as mean and spread",
        ),
    ] = 1,
) -> None:
    """The main job on the real model: a day of three tenants through the gateway in front of
    llama-server (SmolLM2-135M-Instruct, built by `make setup`), with the scheduled warm, a
    knowledge-base change and a deploy that restarts the server with its pre-warm (prefix and
    hot set). It writes report.json, summary.txt and plots to --out: hit rates, false semantic
    hits, stale and cross-tenant hits scored from the text served, TTFT after the deploy with
    and without prefix warming, and the model's seconds from its own timings. Its time is the
    model's: on 2 quiet cores about 2-3 min, 6 when other work shares them, more under load.

    --simulated: week 2 of the sample log replayed through `stoker analyze --warming` with the
    shipped warming and without, in two TTL regimes (a day, three hours), with a deploy on
    Thursday noon and three knowledge-base changes (about 7 min; --fast, which implies it, two
    days in about 3). --seeds N replays the sample log's spec made with N seeds (each in
    --out/seed-<i>) and adds each regime's figures over them, mean and spread, to report.json
    (`over_seeds`). Off a terminal either prints a progress line every 5 s.
    """
    if seeds > 1 and not (simulated or fast):
        raise typer.BadParameter("repeats the simulated run: add --simulated", param_hint="--seeds")
    if simulated or fast:
        # the demo's modules take seconds to import on a busy machine: say something first
        console.print(
            "stoker demo: starting (the sample log replayed in virtual time)", highlight=False
        )
        from demo.simulated.main import main

        main(out, fast, console, seeds)
        return
    console.print(
        "stoker demo: starting (embedded stack, real model: llama-server, SmolLM2-135M)",
        highlight=False,
    )
    from demo.live.main import main_live

    main_live(out, console)


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
