"""`stoker model setup | serve`: the embedded real model (llama.cpp's llama-server, SmolLM2)."""

from __future__ import annotations

import signal
import threading
from types import FrameType
from typing import Annotated

import typer

from schemas.errors import UsageError
from stoker.app import Typer, app, console, examples

model_app = Typer(
    help="The embedded real model: llama.cpp's llama-server serving SmolLM2-135M-Instruct.",
    short_help="The embedded real model (llama-server, SmolLM2).",
    epilog=examples("stoker model setup", "stoker model serve --port 8000"),
    no_args_is_help=True,
)
app.add_typer(model_app, name="model")


def _say(line: str) -> None:
    console.print(line, soft_wrap=True)  # a path is not folded, so it can be copied


@model_app.command("setup", short_help="Fetch, check and build llama-server and SmolLM2 once.")
def setup(
    jobs: Annotated[
        int | None, typer.Option(min=1, help="parallel build jobs (default: one per core)")
    ] = None,
) -> None:
    """Fetch the pinned llama.cpp sources and SmolLM2, check their sha256, build llama-server
    once per machine. Cached: a second run returns at once. `make setup` runs it.

    Example: stoker model setup
    """
    from stoker.embedded import ensure_model_server
    from stoker.settings import StokerSettings

    s = StokerSettings()
    got = ensure_model_server(s, say=_say, jobs=jobs)
    console.print(f"llama-server: {got.server}\nmodel: {got.model}", soft_wrap=True)


@model_app.command("serve", short_help="Serve the model, OpenAI-compatible, until Ctrl-C.")
def serve(
    port: Annotated[
        int | None, typer.Option(min=1, max=65_535, help="port on 127.0.0.1 (default: a free one)")
    ] = None,
) -> None:
    """Serve the model, OpenAI-compatible, on 127.0.0.1 until Ctrl-C or SIGTERM; builds it first
    if `stoker model setup` has not run. Threads, slots and context: STOKER_LLAMA_*.

    Example: stoker model serve --port 8000   (then: stoker gateway --upstream
    http://127.0.0.1:8000/v1)
    """
    from stoker.embedded import (
        LOOPBACK,
        LlamaServer,
        ensure_model_server,
        port_free,
        serve_options,
    )
    from stoker.settings import StokerSettings

    s = StokerSettings()
    if port is not None and not port_free(port):
        raise UsageError(f"--port {port}: in use on {LOOPBACK}; choose another, or leave it out")
    got = ensure_model_server(s, say=_say)
    server = LlamaServer(got.server, got.model, serve_options(s, port=port))
    stop = threading.Event()

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        stop.set()

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        console.print(f"starting llama-server ({got.model.name}) ...")
        server.start()
        console.print(
            f"model {server.opts.alias} on {server.base_url} (OpenAI base URL); Ctrl-C stops it",
            soft_wrap=True,
        )
        # A server that dies is reported, not waited on forever.
        while not stop.wait(1.0):
            if not server.alive:
                console.print(f"llama-server exited; its log ends:\n{server.log_tail()}")
                raise typer.Exit(1)
    finally:
        server.stop()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    console.print("llama-server stopped")
