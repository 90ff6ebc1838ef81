"""`stoker sim-backend`: serve the simulated GPU backend (OpenAI-compatible) until interrupted."""

from __future__ import annotations

import asyncio
import contextlib
import signal
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import orjson
import typer

from schemas.errors import ConfigError, ServiceStartError, UsageError
from stoker.app import app, console, examples

if TYPE_CHECKING:
    from simulation.backend.simulator import SimConfig


def _load_answers(path: Path | None) -> dict[str, str]:
    if path is None:
        return {}
    try:
        table = orjson.loads(path.read_bytes())
    except (OSError, orjson.JSONDecodeError) as e:
        raise UsageError(f"--answers {path}: {type(e).__name__}: {e}") from e
    if not isinstance(table, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in table.items()
    ):
        raise UsageError(f"--answers {path}: need a JSON object of prompt -> answer strings")
    return table


async def _serve(cfg: SimConfig, host: str, port: int) -> None:
    from simulation.backend.http import SimServer

    server = SimServer(cfg)
    try:
        await server.start(host, port)
    except OSError as e:
        raise ServiceStartError(f"cannot listen on {host}:{port}: {e}") from e
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    console.print(
        f"simulated backend on http://{host}:{server.port} "
        f"({cfg.slots} slots, queue {cfg.queue}, prefix cache {cfg.prefix_cache_tokens:,} "
        "tokens); Ctrl-C stops it"
    )
    try:
        await stop.wait()
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(ValueError):
                loop.remove_signal_handler(sig)
        await server.stop()
    console.print(f"stopped: {server.sim.stats}")


@app.command(
    "sim-backend",
    short_help="Serve a simulated GPU backend, OpenAI-compatible.",
    epilog=examples(
        "stoker sim-backend --port 8000",
        "stoker sim-backend --port 8000 --slots 16 --decode-ms-per-token 20",
    ),
)
def sim_backend(
    port: Annotated[int, typer.Option(min=0, max=65535, help="TCP port (0: any free one)")],
    host: Annotated[str, typer.Option(help="address to listen on")] = "127.0.0.1",
    slots: Annotated[int, typer.Option(min=0, help="concurrent generations (batch slots)")] = 8,
    queue: Annotated[int, typer.Option(min=0, help="waiting requests before 429")] = 64,
    prefill_ms_per_token: Annotated[float, typer.Option(min=0.0, help="ms per input token")] = 0.2,
    decode_ms_per_token: Annotated[float, typer.Option(min=0.0, help="ms per output token")] = 10.0,
    max_tokens: Annotated[int, typer.Option(min=1, help="answer length cap by default")] = 64,
    model: Annotated[list[str], typer.Option(help="model ids it serves")] = [  # noqa: B006
        "sim-model"
    ],
    answers: Annotated[
        Path | None, typer.Option(help="JSON object prompt -> answer (paraphrases may share)")
    ] = None,
    prefix_cache_tokens: Annotated[
        int, typer.Option(min=0, help="KV prefix cache capacity in tokens (0: no prefix caching)")
    ] = 131_072,
    prefix_block_tokens: Annotated[
        int, typer.Option(min=1, help="tokens per cached KV block (vLLM's --block-size)")
    ] = 16,
) -> None:
    """Serve a simulated GPU: latency per token, fixed batch slots, a bounded queue, 429s."""
    from simulation.backend.simulator import SimConfig

    try:
        cfg = SimConfig(
            slots=slots,
            queue=queue,
            prefill_ms_per_token=prefill_ms_per_token,
            decode_ms_per_token=decode_ms_per_token,
            min_answer_tokens=min(8, max_tokens),
            default_max_tokens=max_tokens,
            models=tuple(model),
            answers=_load_answers(answers),
            prefix_cache_tokens=prefix_cache_tokens,
            prefix_block_tokens=prefix_block_tokens,
        )
    except ValueError as e:
        raise ConfigError(str(e)) from e
    asyncio.run(_serve(cfg, host, port))
