"""What a worker process checks at start: does each URL it will call answer?

`stoker worker` (and `stoker gateway` for the workers it runs) checks, in parallel and within
CHECK_S each:
- Kafka (STOKER_KAFKA_BOOTSTRAP): the broker's metadata;
- Redis (STOKER_REDIS_URL): a PING;
- the model server the workers send to: the warm backend (STOKER_WARM_BACKEND_URL: the deploy
  pre-warm, the scheduler's warm runs, the re-warm), the monitor's and the prefix warm's where
  they are set apart: GET <base>/models.
One line names what answered; a warning line names each URL that did not, with its setting and
what fails until it answers. A warning, not an exit: services start in any order (Kafka and Redis
seconds after the workers, a model server minutes later, as it loads its weights), the workers
retry an outage of Kafka or Redis with back-off, and a warm run or a deploy that cannot connect
to the model server fails at once, naming the URL (backends/client.py). Refusing to start
would make start order matter, and would tell the operator nothing this line does not.
"""

from __future__ import annotations

import concurrent.futures
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass

from rich.console import Console
from rich.markup import escape

from schemas.baseurl import BaseURL
from stoker.settings import StokerSettings

# Each check's bound: a service on this network answers a connect in milliseconds; 3 s covers a
# loaded machine and delays the start by that much at most, whatever does not answer.
CHECK_S = 3.0
_WARMING = frozenset({"deploy", "scheduler", "rewarm"})


@dataclass(frozen=True)
class Target:
    """A URL a worker will call: what it is, the setting it came from, what fails without it."""

    what: str
    url: str
    setting: str
    without: str
    probe: Callable[[str], str]  # the URL -> what answered; raises when nothing did


@dataclass(frozen=True)
class Checked:
    target: Target
    ok: bool
    detail: str

    def line(self) -> str:
        t = self.target
        backend = t.probe is _backend
        url = BaseURL.parse(t.url).api if backend else t.url  # the base the clients use
        if self.ok:
            return f"{t.what} at {url} ({self.detail})"
        hint = " (set it to your model server's base URL, e.g. http://gpu-0:8000/v1)"
        return (
            f"{t.what} at {url} ({t.setting}) does not answer ({self.detail}): {t.without} "
            f"until it does{hint if backend else ''}"
        )


def targets(s: StokerSettings, names: Collection[str], skip: Iterable[str] = ()) -> list[Target]:
    """What the named workers will call, once each (a URL in `skip` is checked elsewhere)."""
    out: list[Target] = []
    if s.kafka_bootstrap:
        out.append(Target("Kafka", s.kafka_bootstrap, "STOKER_KAFKA_BOOTSTRAP",
                          "the workers consume nothing", _kafka))  # fmt: skip
    if s.redis_url:
        out.append(Target("Redis", s.redis_url, "STOKER_REDIS_URL",
                          "the workers retry every batch", _redis))  # fmt: skip
    warm = _warm_url(s)
    if _WARMING & set(names) and warm is not None:
        out.append(Target("the warm backend", *warm,
                          "deploys fail and warm runs send nothing", _backend))  # fmt: skip
        if s.prefix_warm_backend_url:
            out.append(Target("the prefix-warm backend", s.prefix_warm_backend_url,
                              "STOKER_PREFIX_WARM_BACKEND_URL", "prefix warms send nothing",
                              _backend))  # fmt: skip
    monitor = _monitor_url(s)
    if "monitor" in names and monitor is not None:
        out.append(Target("the monitor's backend", *monitor,
                          "the wrong-hit monitor re-asks nothing", _backend))  # fmt: skip
    seen, skipped = set(), {BaseURL.parse(u).api for u in skip}
    unique = []
    for t in out:
        key = BaseURL.parse(t.url).api if t.probe is _backend else t.url
        if key not in seen and key not in skipped:
            seen.add(key)
            unique.append(t)
    return unique


def check(items: list[Target]) -> list[Checked]:
    """Every target probed at once; each within CHECK_S."""
    if not items:
        return []

    def one(t: Target) -> Checked:
        try:
            return Checked(t, True, t.probe(t.url))
        except Exception as e:  # whatever a client raises, the line says it
            return Checked(t, False, _why(e))

    with concurrent.futures.ThreadPoolExecutor(len(items), "stoker-check") as pool:
        return list(pool.map(one, items))


def report_checks(
    s: StokerSettings, names: Collection[str], console: Console, skip: Iterable[str] = ()
) -> list[Checked]:
    """Check what the workers will call, and say so: one line for what answers, one warning
    line for each URL that does not."""
    done = check(targets(s, names, skip))
    up = [c.line() for c in done if c.ok]
    if up:
        console.print(escape("answering: " + "; ".join(up)), soft_wrap=True)
    for c in done:
        if not c.ok:
            console.print(f"[yellow]warning[/yellow]: {escape(c.line())}", soft_wrap=True)
    return done


def _warm_url(s: StokerSettings) -> tuple[str, str] | None:
    if s.warm_backend_url:
        return s.warm_backend_url, "STOKER_WARM_BACKEND_URL"
    if s.gateway_upstream_url:
        return s.gateway_upstream_url, "STOKER_GATEWAY_UPSTREAM_URL"
    return None


def _monitor_url(s: StokerSettings) -> tuple[str, str] | None:
    if s.monitor_backend_url:
        return s.monitor_backend_url, "STOKER_MONITOR_BACKEND_URL"
    return _warm_url(s)


def _kafka(bootstrap: str) -> str:
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient

    from streams.topics import admin_config

    admin = AdminClient(admin_config(bootstrap))
    try:
        meta = admin.list_topics(timeout=CHECK_S)
    except KafkaException as e:
        raise ConnectionError(f"no metadata within {CHECK_S:.0f} s: {e.args[0].str()}") from None
    finally:
        admin.poll(0)  # hand librdkafka's lines to logging (streams/kafkalog.py)
    return f"{len(meta.brokers)} broker{'s' if len(meta.brokers) != 1 else ''}"


def _redis(url: str) -> str:
    from stoker.redisconn import connect

    r = connect(url, socket_timeout=CHECK_S, socket_connect_timeout=CHECK_S)
    try:
        r.ping()
    finally:
        r.close()
    return "PING"


def _backend(url: str) -> str:
    from backends.client import list_models  # the one client: its URL rule and error names

    ids = list_models(url, CHECK_S)
    if ids is None:
        return "GET /models answered"
    return f"serves {', '.join(ids[:3])}{' ...' if len(ids) > 3 else ''}" if ids else "no models"


def _why(e: BaseException) -> str:
    text = str(e)
    return f"{type(e).__name__}: {text}" if text else type(e).__name__
