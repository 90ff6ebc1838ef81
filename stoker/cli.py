"""The `stoker` command. Exit codes are the contract: 0 done, 1 failed, 2 bad usage."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from schemas.errors import StokerError

app = typer.Typer(
    name="stoker",
    help="Keeps ML-inference caches hot and correct.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
console = Console(stderr=True)


@app.command()
def demo(
    out: Annotated[Path, typer.Option(help="folder for report.json and plots")] = Path("out/demo"),
    fast: Annotated[bool, typer.Option(help="a short run, for the tests")] = False,
) -> None:
    """Run the main job on the embedded stack (Tansu, redis-server, Qdrant Edge) and report."""
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


@app.command()
def version() -> None:
    """Print stoker's version."""
    from importlib.metadata import version as v

    typer.echo(v("stoker"))


def main() -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    try:
        app()
    except StokerError as e:
        console.print(f"[red]error[/red] ({e.kind}): {e}")
        sys.exit(1)


if __name__ == "__main__":
    main()
