"""`stoker sample-log`: write the reproducible two-week request log built from CLINC150."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from stoker.app import app, console, examples


@app.command(
    "sample-log",
    short_help="Write the reproducible sample request log (CLINC150).",
    epilog=examples("stoker sample-log --out data/sample/requests-2w.parquet --days 14"),
)
def sample_log(
    out: Annotated[Path, typer.Option(help="where to write the log (.parquet)")] = Path(
        "data/sample/requests-2w.parquet"
    ),
    days: Annotated[int, typer.Option(min=1, max=366, help="days of traffic")] = 14,
    per_day: Annotated[int, typer.Option(min=1, help="mean requests per weekday")] = 6_000,
    seed: Annotated[int, typer.Option(help="random seed (same seed, same log)")] = 150,
) -> None:
    """Generate the sample traffic log (3 tenants, Zipf intents, real paraphrases, weekly shape)."""
    from simulation.logs.sample import SampleSpec, generate, load_clinc, write
    from stoker.data import data_dir

    data = data_dir()
    load_clinc(data_dir=data)  # a missing or unreadable CLINC150 fails now, in one line (exit 2)
    spec = SampleSpec(days=days, requests_per_day=per_day, seed=seed)
    with console.status(f"generating {days} days of traffic ..."):
        df = generate(spec, data)
    write(df, out, spec)
    console.print(f"wrote {len(df):,} requests to {out} ({out.stat().st_size / 1e6:.1f} MB)")
