"""`stoker analyze LOG --warming`, wired: the shipped warming replayed on a log in virtual time.

The parts are the ones `stoker worker scheduler` and the deploy worker run, built by the same
Stack from the same settings (the user's, with each run's TTL): the planner, the scheduler's
warm job, the headroom, the pacing and the deploy pre-warm. What differs is underneath them:
time is the replay's clock (warmers/replay/run.py), the cache is a virtual one, the model
server is a ledger priced from the log's own `gpu_ms`, and the traffic profile lives in a
private redis-server started for the run (never the one configured: a what-if writes nothing
to production). The log before `start` is the history; each TTL is one replay with warming
and one without (warmers/replay/report.py makes the figures).
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import queue
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from caches.live import LiveVersions
from schemas.errors import UsageError
from schemas.events import RequestLogged
from schemas.prewarm import PrewarmRequest
from stoker import wiring as W
from stoker.embedded import EmbeddedStack
from stoker.settings import StokerSettings
from stoker.stack import Stack
from streams.replay import BadRow, detect_format, read_rows, to_event
from warmers.headroom import ScheduledWarm
from warmers.replay.cache import Ledger, VirtualCache
from warmers.replay.report import regime_figures
from warmers.replay.run import DEPLOYED_VERSION, Arm, Replay, Row, VirtualClock, rows_of
from warmers.replay.sender import VirtualSender

DEFAULT_TEST_DAYS = 7  # --from: by default all but the last week


@dataclass
class LoadedLog:
    events: list[RequestLogged]
    rows_read: int
    bad: dict[str, int] = field(default_factory=dict)  # reason -> rows skipped

    @property
    def first(self) -> datetime:
        return self.events[0].ts

    @property
    def last(self) -> datetime:
        return self.events[-1].ts


def load_log(path: Path) -> LoadedLog:
    """Every valid RequestLogged row of `path` (jsonl, csv or parquet, as `stoker replay` reads
    it), in time order; bad rows are counted by reason. UsageError when none is valid."""
    fmt = detect_format(path)
    events: list[RequestLogged] = []
    bad: dict[str, int] = {}
    n = 0
    for line, row in read_rows(path, fmt):
        n += 1
        if isinstance(row, BadRow):
            bad[row.reason] = bad.get(row.reason, 0) + 1
            continue
        try:
            events.append(to_event(line, row))
        except BadRow as e:
            bad[e.reason] = bad.get(e.reason, 0) + 1
    if not events:
        why = ", ".join(f"{v} {k}" for k, v in bad.items()) or "no rows"
        raise UsageError(f"{path.name}: no valid request_logged row ({why})")
    events.sort(key=lambda e: e.ts)
    return LoadedLog(events, n, bad)


def split_at(log: LoadedLog, start: datetime | None) -> datetime:
    """The replay's first instant: `start`, or the log's last day less DEFAULT_TEST_DAYS (its
    midnight, UTC); UsageError when no history or nothing to replay would be left."""
    if start is None:
        last = log.last.replace(hour=0, minute=0, second=0, microsecond=0)
        start = last + timedelta(days=1) - timedelta(days=DEFAULT_TEST_DAYS)
    if not log.first < start <= log.last:
        raise UsageError(
            f"--from {start:%Y-%m-%d %H:%M} UTC must fall inside the log, after its first "
            f"request ({log.first:%Y-%m-%d %H:%M}) and by its last ({log.last:%Y-%m-%d %H:%M})"
        )
    return start


def differing_settings(s: StokerSettings) -> dict[str, Any]:
    """The settings that differ from the defaults (what the figures depend on beyond them),
    connection settings and secrets left out."""
    base = StokerSettings.model_construct()
    skip = ("url", "bootstrap", "api_key", "path", "host", "port", "dir")
    out: dict[str, Any] = {}
    for name in type(s).model_fields:
        if any(part in name for part in skip):
            continue
        mine, theirs = getattr(s, name), getattr(base, name, None)
        if mine != theirs:
            out[name] = mine.model_dump() if isinstance(mine, BaseModel) else mine
    return out


@dataclass
class RegimeRun:
    ttl_s: int
    warm: Arm
    base: Arm
    seconds: float


@dataclass(frozen=True)
class Story:
    """What happens during the replay beyond the traffic: a deploy, knowledge-base changes."""

    deploy_at: datetime | None = None
    kb_changes: tuple[tuple[datetime, str, str], ...] = ()  # (time, tenant, doc id)


def replay_regime(
    s: StokerSettings,
    rows: list[Row],
    start: datetime,
    end: datetime,
    ttl_s: int,
    story: Story,
    progress: Callable[[str, float], None] | None = None,
) -> RegimeRun:
    """One TTL: the baseline, then the shipped warming, on a private redis-server."""
    t0 = time.perf_counter()
    deploy_at = story.deploy_at
    replay = Replay(rows, start, end, float(ttl_s), s.warm_interval_s, deploy_at, story.kb_changes)
    clock = VirtualClock(start)
    if progress is not None:
        replay.progress = lambda f: progress("without warming", f)
    base = replay.run(Arm(False), VirtualCache(ttl_s, clock), clock)
    if progress is not None:
        replay.progress = lambda f: progress("with warming", f)
    with _private_redis(s, ttl_s) as rs, Stack(rs, clock=clock) as stack:
        cache, ledger = VirtualCache(ttl_s, clock), Ledger()
        sender = VirtualSender(cache, ledger, clock, rs.warm_qps, rs.warm_min_ttl_left_s)
        runner = stack.runner(progress=False, freshness=cache, send=sender)
        replay.feed(stack.profile, replay.history())
        room = W.build_headroom(rs, runner, busy=ledger.busy, clock=clock)
        job = ScheduledWarm(runner, W.default_budget(rs), room)
        deploy = None
        if deploy_at is not None:
            prewarmer = W.build_prewarmer(rs, runner, busy=ledger.busy, clock=clock)
            model = rows[-1].event.model_id
            previous = rows[-1].event.model_version

            def deploy() -> object:
                LiveVersions(stack.redis).set(
                    model, DEPLOYED_VERSION, deploy_id="replay",
                    accepted_at=clock.now.timestamp(),
                )  # fmt: skip
                return prewarmer.prewarm(PrewarmRequest(model, DEPLOYED_VERSION, previous))

        warm = replay.run(
            Arm(True, ledger, sent=sender.sent), cache, clock, warm=job, deploy=deploy,
            profile=stack.profile, calibration=runner.calibration, base=base,
        )  # fmt: skip
    return RegimeRun(ttl_s, warm, base, time.perf_counter() - t0)


@contextlib.contextmanager
def _private_redis(s: StokerSettings, ttl_s: int) -> Iterator[StokerSettings]:
    """The run's settings on a redis-server of its own, with the regime's TTL, the semantic
    layer off (the replay serves exact entries) and no Kafka."""
    with EmbeddedStack(kafka=False) as embedded:
        url = embedded.settings().redis_url
        yield s.model_copy(
            update={"redis_url": url, "exact_ttl_s": ttl_s, "semantic_ttl_s": ttl_s,
                    "semantic_enabled": False}
        )  # fmt: skip


def analyze_warming(
    s: StokerSettings,
    log: LoadedLog,
    start: datetime,
    ttls: Sequence[int],
    story: Story = Story(),
    progress: Callable[[str, float], None] | None = None,
    end: datetime | None = None,
) -> dict[str, Any]:
    """Every TTL of `ttls` replayed from `start` to `end` (the log's end): the report
    (warmers/replay/report.py)."""
    deploy_at = story.deploy_at
    end = end or log.last + timedelta(seconds=1)
    if deploy_at is not None and not start <= deploy_at < end:
        raise UsageError(
            f"--deploy-at {deploy_at:%Y-%m-%d %H:%M} UTC must fall inside the replayed span "
            f"({start:%Y-%m-%d %H:%M}..{log.last:%Y-%m-%d %H:%M})"
        )
    rows = rows_of(log.events, DEPLOYED_VERSION if deploy_at is not None else None)
    figures = _regimes(s, rows, start, end, ttls, story, progress)
    regimes = {f"ttl_{_fmt_ttl(ttl)}": f for ttl, f in zip(ttls, figures, strict=True)}
    return {
        "log": {"rows": log.rows_read, "valid": len(log.events), "bad": log.bad,
                "first": log.first.isoformat(), "last": log.last.isoformat()},
        "history": {"from": log.first.isoformat(), "to": start.isoformat(),
                    "requests": sum(1 for r in rows if r.t < start.timestamp())},
        "replayed": {"from": start.isoformat(), "to": end.isoformat(),
                     "requests": sum(1 for r in rows if r.t >= start.timestamp())},
        "deploy_at": None if deploy_at is None else deploy_at.isoformat(),
        "kb_changes": [
            {"at": at.isoformat(), "tenant": tenant, "doc_id": doc}
            for at, tenant, doc in story.kb_changes
        ],
        "settings_not_default": differing_settings(s),
        "regimes": regimes,
    }  # fmt: skip


def _regimes(
    s: StokerSettings,
    rows: list[Row],
    start: datetime,
    end: datetime,
    ttls: Sequence[int],
    story: Story,
    progress: Callable[[str, float], None] | None,
) -> list[dict[str, Any]]:
    """Each TTL's figures, the TTLs side by side in processes of their own (one per core):
    a replay is one Python thread's work, and each has its own redis-server."""
    workers = min(len(ttls), os.cpu_count() or 1)
    if workers <= 1:
        return [_regime(s, rows, start, end, ttl, story, progress) for ttl in ttls]
    ctx = multiprocessing.get_context("spawn")  # no fork of a process with threads
    with ctx.Manager() as manager:
        steps = manager.Queue()
        with ProcessPoolExecutor(workers, mp_context=ctx) as pool:
            futures = [
                pool.submit(_regime_in_process, s, rows, start, end, ttl, story, steps)
                for ttl in ttls
            ]
            while not all(f.done() for f in futures):
                with contextlib.suppress(queue.Empty):
                    what, done = steps.get(timeout=0.5)
                    if progress is not None:
                        progress(what, done)
            return [f.result() for f in futures]


def _regime(
    s: StokerSettings,
    rows: list[Row],
    start: datetime,
    end: datetime,
    ttl: int,
    story: Story,
    progress: Callable[[str, float], None] | None,
) -> dict[str, Any]:
    def step(arm: str, f: float) -> None:
        if progress is not None:
            progress(f"TTL {_fmt_ttl(ttl)}, {arm}", f)

    run = replay_regime(s, rows, start, end, ttl, story, step)
    return regime_figures(run.warm, run.base, ttl, run.seconds, end.timestamp())


def _regime_in_process(
    s: StokerSettings,
    rows: list[Row],
    start: datetime,
    end: datetime,
    ttl: int,
    story: Story,
    steps: Any,
) -> dict[str, Any]:
    """_regime in a worker process; its progress goes to the parent through `steps`, at most
    every 2 seconds."""
    last = [0.0]

    def report(what: str, done: float) -> None:
        now = time.monotonic()
        if now - last[0] >= 2.0 or done >= 1.0:
            last[0] = now
            steps.put((what, done))

    return _regime(s, rows, start, end, ttl, story, report)


def _fmt_ttl(seconds: int) -> str:
    for unit, n in (("d", 86_400), ("h", 3_600), ("m", 60)):
        if seconds % n == 0:
            return f"{seconds // n}{unit}"
    return f"{seconds}s"
