"""The connection options of every verb that connects, defined once, and how a verb finds what to
connect to.

Each option overrides its setting, and reads the same on every verb that reaches that service:
    --kafka-bootstrap HOST:PORT   STOKER_KAFKA_BOOTSTRAP   (deploy, invalidate, replay, worker,
                                                           gateway)
    --redis-url URL               STOKER_REDIS_URL         (status, warm, warm-prefixes, purge,
                                                           analyze, worker, gateway)
    --qdrant-url URL              STOKER_QDRANT_URL        (warm, purge, worker, gateway): a
                                  Qdrant server, so it also sets STOKER_SEMANTIC_BACKEND=server
A verb with neither Kafka nor Redis configured, on the command line or in the environment, uses
the embedded stack a `stoker worker all` or `stoker gateway` runs on this machine (its addresses
are in embedded.json: stoker/embedded_state.py), and says so in one line; with none running,
what it needs is missing and it exits 2 (a configuration error) naming the setting. (`stoker
worker` and `stoker gateway` themselves start an embedded stack of their own instead: Qdrant
Edge lives in one process, and the workers that invalidate its vectors must live there too.)
"""

from __future__ import annotations

from typing import Annotated, Any

import typer
from rich.console import Console

from schemas.baseurl import BaseURL
from schemas.errors import ConfigError
from stoker import embedded_state
from stoker.settings import StokerSettings


def _url(value: str | None) -> str | None:
    """A --backend or --upstream URL in any form schemas/baseurl.py takes; exit 2 otherwise."""
    if value is not None:
        try:
            BaseURL.parse(value)
        except ConfigError as e:
            raise typer.BadParameter(str(e)) from None
    return value


KafkaBootstrap = Annotated[
    str | None,
    typer.Option(
        "--kafka-bootstrap",
        "--bootstrap",
        metavar="HOST:PORT",
        help="Kafka; default STOKER_KAFKA_BOOTSTRAP (neither it nor Redis set: the embedded stack)",
    ),
]
RedisUrl = Annotated[
    str | None,
    typer.Option(
        "--redis-url",
        metavar="URL",
        help="Redis (redis://, rediss://, redis+cluster://); default STOKER_REDIS_URL "
        "(neither it nor Kafka set: the embedded stack)",
    ),
]
QdrantUrl = Annotated[
    str | None,
    typer.Option(
        "--qdrant-url",
        metavar="URL",
        help="a Qdrant server (sets STOKER_SEMANTIC_BACKEND=server); default STOKER_QDRANT_URL",
    ),
]
WarmBackend = Annotated[
    str | None,
    typer.Option(
        "--backend",
        metavar="URL",
        callback=_url,
        help="the model server's OpenAI base URL (http://host:8000/v1); default "
        "STOKER_WARM_BACKEND_URL",
    ),
]
PrefixBackend = Annotated[
    str | None,
    typer.Option(
        "--backend",
        metavar="URL",
        callback=_url,
        help="the replica's OpenAI base URL (http://host:8000/v1); default "
        "STOKER_PREFIX_WARM_BACKEND_URL, else STOKER_WARM_BACKEND_URL",
    ),
]
Upstream = Annotated[
    str | None,
    typer.Option(
        "--upstream",
        metavar="URL",
        callback=_url,
        help="the model server's OpenAI base URL (http://host:8000/v1, http://host/llm/v1); "
        "default STOKER_GATEWAY_UPSTREAM_URL, else STOKER_WARM_BACKEND_URL",
    ),
]


def overrides(
    kafka_bootstrap: str | None = None,
    redis_url: str | None = None,
    qdrant_url: str | None = None,
) -> dict[str, Any]:
    """The settings the connection options given on the command line set."""
    out: dict[str, Any] = {}
    if kafka_bootstrap:
        out["kafka_bootstrap"] = kafka_bootstrap
    if redis_url:
        out["redis_url"] = redis_url
    if qdrant_url:
        out |= {"qdrant_url": qdrant_url, "semantic_backend": "server"}
    return out


def connected(
    console: Console | None = None,
    *,
    kafka_bootstrap: str | None = None,
    redis_url: str | None = None,
    qdrant_url: str | None = None,
    **settings: Any,
) -> StokerSettings:
    """The settings (STOKER_*, then the options given, then `settings`), pointed at the running
    embedded stack when they name neither Kafka nor Redis (see the module docstring)."""
    s = StokerSettings(**(overrides(kafka_bootstrap, redis_url, qdrant_url) | settings))
    return on_embedded(s, console)


def on_embedded(s: StokerSettings, console: Console | None = None) -> StokerSettings:
    """`s`, or `s` on the running embedded stack's Kafka and Redis when it names neither (one
    configured and not the other is the user's own set-up: nothing is filled in then)."""
    if s.kafka_bootstrap or s.redis_url:
        return s
    doc = embedded_state.read(embedded_state.state_path(s.state_dir))
    if doc is None:
        return s
    fields: dict[str, Any] = {"kafka_bootstrap": doc.get("kafka_bootstrap"), "kafka_broker": "tansu",
                              "redis_url": doc.get("redis_url")}  # fmt: skip
    if doc.get("model_url") and not (s.warm_backend_url or s.gateway_upstream_url):
        # the model server that stack's workers warm: a warm from here goes where theirs go
        fields["warm_backend_url"] = doc["model_url"]
    if console is not None:
        # its Qdrant Edge store lives inside that process: semantic vectors are its own
        console.print(
            f"using the embedded stack of `{doc.get('what', 'another process')}` "
            f"(pid {doc.get('pid')}): Kafka at {fields['kafka_bootstrap']}, Redis at "
            f"{fields['redis_url']}",
            soft_wrap=True,
        )
    return s.model_copy(update=fields)
