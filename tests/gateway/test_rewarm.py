"""The re-warm after a KB change, end to end: RAG requests through the gateway -> request log on
Tansu -> traffic worker; then a KB change carrying the document's new and old text -> the
invalidation and rewarm workers (threads, as `stoker worker all` runs them) -> the next live
request, which inlines the new text, is a hit whose answer was computed from the new text."""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import openai
import pytest
import redis

from invalidators.invalidation import Invalidator
from schemas.events import KnowledgeBaseChanged
from simulation.backend.http import SimulatorThread
from stoker.runtime import WorkerGroup
from stoker.stack import Stack
from stoker.wiring import worker_config
from streams.worker import Worker
from tests.gateway.conftest import GatewayFactory, client, stack_of
from tests.waiting import wait_for
from warmers.hotset.window import Window
from warmers.rewarm import InvalidationPending, RewarmHandler, RewarmOptions
from warmers.traffic.profile import TrafficProfile
from warmers.traffic.worker import TrafficHandler

OLD = "[doc:kb/reset@v3] Open Settings, then Security, then Reset."
NEW = "[doc:kb/reset@v4] Open Profile, then Password, then Change."
QUESTIONS = ("How do I reset my password?", "Where do I change my password?")
# Names the doc, but inlined it in another form: no substitution can renew it.
REFORMATTED = "What does the reset page say?"
DOCS = {"stoker": {"docs": [{"doc_id": "kb/reset"}]}}
NO_CACHE = {"Cache-Control": "no-cache, no-store"}


def rag(question: str, doc: str) -> list[Any]:
    return [
        {"role": "system", "content": f"Answer only from the context.\n{doc}"},
        {"role": "user", "content": question},
    ]


def _ask(c: openai.OpenAI, question: str, doc: str, **headers: str) -> tuple[str, str]:
    raw = c.chat.completions.with_raw_response.create(
        model="sim-model", messages=rag(question, doc), temperature=0, extra_body=DOCS,
        extra_headers=headers,
    )  # fmt: skip
    return raw.headers["x-stoker-cache"], raw.parse().choices[0].message.content or ""


@pytest.fixture
def learned(
    make_gateway: GatewayFactory,
    sim: SimulatorThread,
    kafka_bootstrap: str,
    redis_url: str,
    unique: str,
    qdrant_path: Path,
) -> tuple[openai.OpenAI, Stack]:
    """A gateway whose RAG traffic (6 asks of each question, the doc's old text inlined) the
    traffic worker has learned; the gateway's Stack, which the workers that follow share."""
    prefix = f"rewarm{unique}."
    # the workers' settings too: they run in the gateway's process, on its Stack
    gw = make_gateway(
        sim.url, kafka_bootstrap=kafka_bootstrap, kafka_broker="tansu", topic_prefix=prefix,
        warm_backend_url=sim.url, warm_min_ttl_left_s=60, worker_poll_s=0.05,
        semantic_matcher="static",
    )  # fmt: skip
    c = client(gw, **{"X-Stoker-Template-Version": "rag-v1"})
    for q in QUESTIONS:
        for _ in range(6):
            _ask(c, q, OLD)
    for _ in range(6):
        _ask(c, REFORMATTED, OLD.upper())
    stack = stack_of(gw)
    s = stack.settings
    handler = TrafficHandler(TrafficProfile(redis.Redis.from_url(redis_url)))
    assert Worker(handler, worker_config(s, handler, f"g{unique}")).run_until(
        lambda st: st.events >= 18, 30
    )
    return c, stack


def _tomorrow() -> Window:
    """The same hour tomorrow: the planner learns from past days (today's traffic is history)."""
    hour = datetime.now(UTC).replace(minute=0, second=0, microsecond=0) + timedelta(days=1)
    return Window(hour, hour + timedelta(hours=1))


def change(version: int = 4) -> KnowledgeBaseChanged:
    return KnowledgeBaseChanged(
        tenant="acme", doc_id="kb/reset", doc_version=version, change="updated",
        schema_version=2, text=NEW, previous_text=OLD,
    )  # fmt: skip


def test_rewarm__a_kb_change_with_its_new_text_rewarms_the_hot_requests_that_inlined_the_old(
    learned: tuple[openai.OpenAI, Stack], sim: SimulatorThread, caplog: pytest.LogCaptureFixture
) -> None:
    c, stack = learned
    caplog.set_level(logging.INFO, logger="warmers.rewarm")
    old_answers = {q: _ask(c, q, OLD)[1] for q in QUESTIONS}
    workers = WorkerGroup(stack, ["invalidation", "rewarm"])
    (rewarm,) = [w.handler for w in workers.workers if isinstance(w.handler, RewarmHandler)]
    rewarm.window = _tomorrow
    workers.start()
    try:
        with stack.publisher as pub:
            pub.publish("inference.kb-changes", change(), key="acme/kb/reset")
            pub.flush()
        wait_for(lambda: rewarm.last is not None or workers.errors, 60, "the re-warm to run")
    finally:
        workers.stop()
        workers.join()
    assert not workers.errors
    assert rewarm.last is not None
    assert (rewarm.last.sent, rewarm.last.cached) == (2, 2)  # the two questions, not the third
    # the log says it for a person, with why the third was left out
    [line] = [r.getMessage() for r in caplog.records if r.name == "warmers.rewarm"]
    assert line == (
        "re-warm after 1 KB change: 2 planned, 1 left out (1 its document kb/reset changed since "
        "it was logged, and the logged request holds none of its known old texts); sent 2, "
        "landed 2, skipped 0 cached, failed 0"
    )

    for q in QUESTIONS:
        outcome, warm = _ask(c, q, NEW)
        assert outcome == "exact"  # the re-warmed entry: no live request filled it
        fresh = _ask(c, q, NEW, **NO_CACHE)[1]
        assert warm == fresh  # computed from the new text, as the live backend answers now
        assert "[doc:kb/reset@v4]" in warm and "@v3" not in warm
        assert warm != old_answers[q]
    assert _ask(c, REFORMATTED, NEW.upper())[0] == "miss"  # not renewed: deleted, not re-warmed


def test_rewarm__waits_for_the_invalidation_and_renews_nothing_before_it(
    learned: tuple[openai.OpenAI, Stack], sim: SimulatorThread
) -> None:
    """Before the invalidation worker applied the change, a warm would land under the old
    floor and be deleted as stale: the batch fails retriably (read again), sending nothing."""
    _, stack = learned
    s = stack.settings
    handler = RewarmHandler(
        stack.runner(progress=False), RewarmOptions(budget_requests=5, wait_s=0.3),
        window=_tomorrow,
    )  # fmt: skip
    served = sim.server.sim.stats.served
    # Nothing to re-warm, so nothing to wait for: a change without its text, a retraction.
    v1 = KnowledgeBaseChanged(tenant="acme", doc_id="kb/reset", doc_version=4, change="updated")
    gone = KnowledgeBaseChanged(tenant="acme", doc_id="kb/reset", doc_version=4, change="retracted")
    handler.apply([v1, gone])
    assert handler.last is None
    with pytest.raises(InvalidationPending, match="not applied by the invalidation worker"):
        handler.apply([change()])
    assert sim.server.sim.stats.served == served and handler.last is None
    # Applied (the floor at the event's version, the old entries deleted): it goes through.
    Invalidator(redis.Redis.from_url(s.redis_url)).kb_changed(change())
    handler.apply([change()])
    assert handler.last is not None and handler.last.cached == 2
