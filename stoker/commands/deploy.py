"""`stoker deploy`: publish ModelDeployed from CI and, with --wait, follow the cutover job."""

from __future__ import annotations

import re
import time
import uuid
from dataclasses import dataclass
from enum import StrEnum
from typing import Annotated, Any, Literal, get_args

import orjson
import typer
from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition
from pydantic import ValidationError
from rich.markup import escape
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from invalidators.deployjob import Phase
from schemas.codec import decode_event
from schemas.errors import EventDecodeError
from schemas.events import JobStatus, ModelDeployed
from stoker.app import app, console, examples
from stoker.connect import KafkaBootstrap, connected
from stoker.settings import StokerSettings
from streams.topics import TOPICS, consumer_config, ensure_topics, topic_name

_DURATION = re.compile(r"(?:(\d+)d)?(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?")
_PHASES = frozenset(get_args(Phase))
Ended = Literal["ready", "done", "failed", "timed out"]
# How long one consume() call may block: the bar and the timeout are checked this often.
_POLL_S = 0.25


class Until(StrEnum):
    ready = "ready"
    done = "done"


def parse_duration(text: str, what: str) -> int:
    """Seconds from "90", "90s", "30m", "24h", "2d" or "1h30m"; BadParameter (exit 2) otherwise."""
    text = text.strip().lower()
    if text.isdigit():
        return int(text)
    m = _DURATION.fullmatch(text)
    if not text or m is None:
        raise typer.BadParameter(
            f"{text!r} is not a duration: use seconds or e.g. 90s, 30m, 24h, 2d, 1h30m",
            param_hint=what,
        )
    d, h, mi, s = (int(g or 0) for g in m.groups())
    return ((d * 24 + h) * 60 + mi) * 60 + s


@app.command(
    short_help="Publish a deploy from CI; --wait follows the cutover.",
    epilog=examples(
        "stoker deploy --model llama-3-8b --version v8 --previous v7",
        "stoker deploy --model llama-3-8b --version v8 --previous v7 --grace 1h \\",
        "    --wait --timeout 10m --json",
    ),
)
def deploy(
    model: Annotated[str, typer.Option("--model", help="model id")],
    version: Annotated[str, typer.Option("--version", help="the version now live")],
    previous: Annotated[
        str | None, typer.Option("--previous", help="the version it replaces (retired, purged)")
    ] = None,
    grace: Annotated[
        str | None,
        typer.Option(
            help="keep --previous this long before purging (0 = at once); default "
            "the worker's STOKER_DEPLOY_GRACE_S (24h)"
        ),
    ] = None,
    tenant: Annotated[
        list[str] | None, typer.Option("--tenant", help="only these tenants (repeat); default all")
    ] = None,
    wait: Annotated[bool, typer.Option("--wait", help="follow the job on stoker.status")] = False,
    timeout: Annotated[str, typer.Option(help="give up waiting after this long (exit 1)")] = "30m",
    until: Annotated[
        Until, typer.Option(help="with --wait: exit 0 once the job is ready, or done")
    ] = Until.ready,
    deploy_id: Annotated[
        str | None, typer.Option(help="job id; reuse it to make a CI retry idempotent")
    ] = None,
    as_json: Annotated[
        bool,
        typer.Option("--json", help="print the outcome as one JSON object on stdout (with --wait)"),
    ] = False,
    kafka_bootstrap: KafkaBootstrap = None,
) -> None:
    """Publish a ModelDeployed event; the deploy worker pre-warms VERSION, reports READY, keeps
    PREVIOUS for the grace window, then retires and purges it. Exit 0 ok, 1 failed or timed
    out, 2 bad usage or no Kafka. Prints the deploy id on stdout (with --json, the outcome)."""
    grace_s = None if grace is None else parse_duration(grace, "--grace")
    timeout_s = parse_duration(timeout, "--timeout")
    try:
        ev = ModelDeployed(
            deploy_id=deploy_id or uuid.uuid4().hex,
            model_id=model,
            version=version,
            previous_version=previous,
            tenants=tuple(tenant) if tenant else None,
            grace_s=grace_s,
        )
    except ValidationError as e:
        raise typer.BadParameter(str(e)) from None
    s = connected(console, kafka_bootstrap=kafka_bootstrap)
    # Following starts before publishing, from the topic's beginning, filtered by job id: no
    # status of this deploy can be missed, whatever end offset the broker reports (Tansu's is
    # wrong), and a retried deploy id sees the statuses it already earned.
    consumer = _follower(s) if wait else None
    try:
        from stoker.stack import Stack  # here: importing the wiring costs ~1 s

        with Stack(s) as stack:
            stack.publisher.publish("inference.deploys", ev, key=ev.model_id)
            stack.publisher.flush()
        if not as_json:
            typer.echo(ev.deploy_id)
        console.print(f"published deploy {ev.deploy_id}: {model} {previous or '-'} -> {version}")
        if consumer is not None:
            t0 = time.monotonic()
            ended, last = _follow(consumer, ev.deploy_id, until, timeout_s)
            outcome = Outcome(ev, ended, last, time.monotonic() - t0, until)
            outcome.show(as_json)
            raise typer.Exit(outcome.code)
        if as_json:
            typer.echo(orjson.dumps({"deploy_id": ev.deploy_id, "state": "published"}).decode())
    finally:
        if consumer is not None:
            consumer.close()


def _follower(s: StokerSettings) -> Consumer:
    from schemas.errors import ConfigError

    if not s.kafka_bootstrap:
        raise ConfigError(
            "no Kafka to publish to: give --kafka-bootstrap or set STOKER_KAFKA_BOOTSTRAP "
            "(or run it beside `stoker worker all` on the embedded stack)"
        )
    name = topic_name("stoker.status", s.topic_prefix)
    ensure_topics(s.kafka_bootstrap, {name: TOPICS["stoker.status"]})
    group = f"stoker-deploy-wait-{uuid.uuid4().hex[:12]}"  # a throwaway group, never committed
    c = Consumer(consumer_config(s.kafka_bootstrap, group, embedded=s.kafka_broker == "tansu"))
    c.assign([TopicPartition(name, p, OFFSET_BEGINNING) for p in _partitions(c, name)])
    return c


def _partitions(c: Consumer, topic: str) -> list[int]:
    """Every partition of the topic: an operator may give stoker.status more than our one, and
    a job's statuses land on the partition its key hashes to."""
    from confluent_kafka import KafkaException

    from schemas.errors import BrokerUnavailable

    try:
        meta = c.list_topics(topic, timeout=10).topics.get(topic)
    except KafkaException as e:
        raise BrokerUnavailable(f"cannot read the partitions of {topic}: {e.args[0]}") from e
    if meta is None or meta.error is not None or not meta.partitions:
        raise BrokerUnavailable(f"topic {topic} has no partitions the broker will tell")
    return sorted(meta.partitions)


def _follow(
    consumer: Consumer, job_id: str, until: Until, timeout_s: int
) -> tuple[Ended, JobStatus | None]:
    """Show the job's JobStatus events until `until` or failed, or the timeout; how it ended
    and the last status seen."""
    deadline = time.monotonic() + timeout_s
    columns = (
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        TextColumn("{task.percentage:>3.0f}% {task.fields[detail]}"),
        TimeElapsedColumn(),
    )
    last: JobStatus | None = None
    bar = Progress(*columns, console=console, transient=True, disable=not console.is_terminal)
    with bar:
        task = bar.add_task(f"deploy {job_id[:12]}", total=1.0, detail="waiting for the worker")
        while (left := deadline - time.monotonic()) > 0:
            for st in _statuses(consumer, job_id, min(_POLL_S, left)):
                ended: Ended | None = None
                if st.state == "failed":
                    ended = "failed"
                elif st.state == "done" or (until is Until.ready and st.state == "ready"):
                    ended = st.state
                if ended is not None:
                    return ended, st
                if bar.disable and (last is None or last.detail != st.detail):
                    # no bar in a CI log: a line a step instead, so a long wait is not silent
                    console.print(escape(f"{st.state}: {st.detail}".rstrip(": ")), soft_wrap=True)
                last = st
                bar.update(task, completed=st.progress, detail=f"{st.state}: {st.detail}"[:60])
    return "timed out", last


@dataclass(frozen=True)
class Outcome:
    """How a followed deploy ended, said for people (stderr) or for machines (--json)."""

    ev: ModelDeployed
    ended: Ended
    last: JobStatus | None
    waited_s: float
    until: Until

    @property
    def code(self) -> int:
        return 0 if self.ended in ("ready", "done") else 1

    def doc(self) -> dict[str, Any]:
        """The --json shape: the deploy, how the wait ended, and the job's last status."""
        st = self.last
        phase, detail = _split(st.detail) if st else (None, None)
        return {
            "deploy_id": self.ev.deploy_id, "model_id": self.ev.model_id,
            "version": self.ev.version, "previous_version": self.ev.previous_version,
            "ended": self.ended, "waited_s": round(self.waited_s, 1),
            "state": st.state if st else None, "phase": phase, "detail": detail,
            "progress": st.progress if st else None, "counts": dict(st.counts) if st else {},
        }  # fmt: skip

    def show(self, as_json: bool) -> None:
        if as_json:
            typer.echo(orjson.dumps(self.doc()).decode())
            return
        ev, st = self.ev, self.last
        colour = "green" if self.code == 0 else "red"
        head = f"deploy {ev.deploy_id[:12]} [{colour}]{self.ended}[/{colour}]"
        after = f"after {self.waited_s:.1f} s" + (
            f" waiting for {self.until.value}" if self.ended == "timed out" else ""
        )
        what = f"{ev.model_id} {ev.previous_version or '-'} -> {ev.version}"
        console.print(f"{head} {after}: {escape(what)}", soft_wrap=True)
        for line in self._lines(st):
            console.print(f"  {escape(line)}", soft_wrap=True)

    def _lines(self, st: JobStatus | None) -> list[str]:
        if st is None:
            return [
                "no status from a deploy worker: is `stoker worker deploy` (or `all`) running "
                "on this Kafka?"
            ]
        phase, detail = _split(st.detail)
        if self.ended == "failed":  # the reason, one line whatever it holds
            return [detail]
        if self.ended == "timed out":
            return [f"last seen {st.state} ({phase}): {detail}"]
        counts = ", ".join(f"{k.replace('_', ' ')} {v:,}" for k, v in st.counts.items())
        return [*detail.split("; "), *([counts] if counts else [])]


def _split(detail: str) -> tuple[str | None, str]:
    """A job status's detail as (phase, the rest): the cutover writes "<phase>: <detail>"."""
    phase, sep, rest = detail.partition(": ")
    return (phase, rest) if sep and phase in _PHASES else (None, detail)


def _statuses(consumer: Consumer, job_id: str, timeout_s: float) -> list[JobStatus]:
    out: list[JobStatus] = []
    for msg in consumer.consume(num_messages=500, timeout=timeout_s):
        if msg.error() is not None:
            continue
        try:
            ev = decode_event(msg.value() or b"")
        except EventDecodeError:
            continue  # not ours to judge: the status topic is shared, and we only follow one job
        if isinstance(ev, JobStatus) and ev.job_id == job_id:
            out.append(ev)
    return out
