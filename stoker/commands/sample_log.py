"""`stoker sample-log`: write the reproducible two-week request log built from CLINC150."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated

import typer

from stoker.app import app, console, examples


@app.command(
    "sample-log",
    short_help="Write the reproducible sample request log (CLINC150).",
    epilog=examples(
        "stoker sample-log --out data/sample/requests-2w.parquet --days 14",
        "stoker sample-log --gateway --days 7 --per-day 2000 --out sample.parquet",
    ),
)
def sample_log(
    out: Annotated[Path, typer.Option(help="where to write the log (.parquet)")] = Path(
        "data/sample/requests-2w.parquet"
    ),
    days: Annotated[int, typer.Option(min=1, max=366, help="days of traffic")] = 14,
    per_day: Annotated[int, typer.Option(min=1, help="mean requests per weekday")] = 6_000,
    seed: Annotated[int, typer.Option(help="random seed (same seed, same log)")] = 150,
    gateway: Annotated[
        bool,
        typer.Option(
            "--gateway",
            help="as `stoker gateway` logs a plain chat request: to its model, in the "
            "version it serves, no system prompt or documents, the days before today; "
            "replayed, its warms land where the gateway reads",
        ),
    ] = False,
    model: Annotated[
        str | None,
        typer.Option(
            help="the model the requests name; default llama-3-8b, or with --gateway the "
            "embedded model server's (smollm2-135m-instruct)"
        ),
    ] = None,
) -> None:
    """Generate the sample traffic log (3 tenants, Zipf intents, real paraphrases, weekly shape).

    Without --gateway it is the committed log's shape (from Monday 2026-11-02, model
    llama-3-8b): for `stoker analyze` and the benchmarks. A warm learned from it lands in a
    namespace no gateway request reads; --gateway writes the same traffic as the gateway
    would have logged it, for trying warming on a running `stoker gateway`."""
    from gateway.identity import NO_SYSTEM_TEMPLATE
    from simulation.logs.sample import SampleSpec, as_gateway_logs, generate, load_clinc, write
    from stoker.data import data_dir
    from stoker.modelserver import MODEL_ALIAS
    from stoker.settings import StokerSettings

    settings = StokerSettings()
    data = data_dir(settings)
    load_clinc(data_dir=data)  # a missing or unreadable CLINC150 fails now, in one line (exit 2)
    spec = SampleSpec(days=days, requests_per_day=per_day, seed=seed)
    if gateway:
        version = settings.gateway_default_model_version
        today = datetime.now(UTC).date()
        spec = as_gateway_logs(spec, model or MODEL_ALIAS, version, NO_SYSTEM_TEMPLATE, today)
    elif model is not None:
        spec = replace(spec, model_id=model)
    with console.status(f"generating {days} days of traffic ..."):
        df = generate(spec, data)
    write(df, out, None if gateway else spec)  # --gateway's requests retrieve no articles
    console.print(f"wrote {len(df):,} requests to {out} ({out.stat().st_size / 1e6:.1f} MB)")
    if gateway:
        console.print(
            f"model {spec.model_id}, version {spec.model_version}, "
            f"{spec.start:%Y-%m-%d}..{today:%Y-%m-%d} UTC; next: stoker replay {out}"
        )
