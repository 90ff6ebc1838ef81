"""The warmer replays the logged request: a warm answer for RAG traffic is computed from the same
system prompt and inlined documents as the live request its key names, end to end (gateway ->
request log on Tansu -> traffic worker -> deploy pre-warm -> the new version's entry)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import redis

from caches.generations import Generations
from schemas.codec import decode_event
from schemas.events import RequestLogged
from schemas.prewarm import PrewarmRequest
from simulation.backend.http import SimulatorThread
from stoker.wiring import build_prewarmer, worker_config
from streams.topics import topic_name
from streams.worker import Worker
from tests.gateway.conftest import GatewayFactory, client, stack_of
from tests.streams.conftest import read_topic
from warmers.hotset.warm_budget import Budget
from warmers.hotset.window import Window
from warmers.traffic.profile import TrafficProfile
from warmers.traffic.worker import TrafficHandler

QUESTION = "How do I reset my password?"
SYSTEM = "Answer only from the context.\n[kb/reset v3] Open Settings, then Security, then Reset."
RAG = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": QUESTION}]
DOCS = {"stoker": {"docs": [{"doc_id": "kb/reset"}]}}


def test_warm_replay__a_warm_rag_answer_equals_the_live_answer_for_that_context(
    make_gateway: GatewayFactory,
    sim: SimulatorThread,
    kafka_bootstrap: str,
    redis_url: str,
    redis_client: redis.Redis,
    unique: str,
    qdrant_path: Path,
) -> None:
    prefix = f"replay{unique}."
    # the warm's settings too: the runner below is a part of the gateway's process
    gw = make_gateway(sim.url, kafka_bootstrap=kafka_bootstrap, kafka_broker="tansu",
                      topic_prefix=prefix, warm_backend_url=sim.url, warm_min_ttl_left_s=60)  # fmt: skip
    c = client(gw, **{"X-Stoker-Template-Version": "rag-v1"})
    # Asked often enough to be worth warming (1 miss, then hits; the profile counts them all).
    answers = {
        c.chat.completions.create(model="sim-model", messages=RAG, temperature=0, extra_body=DOCS)
        .choices[0]
        .message.content
        for _ in range(6)
    }
    (live_text,) = answers

    stack = stack_of(gw)
    s = stack.settings
    handler = TrafficHandler(TrafficProfile(redis.Redis.from_url(redis_url)))
    assert Worker(handler, worker_config(s, handler, f"g{unique}")).run_until(
        lambda st: st.events >= 6, 30
    )

    # The same hour tomorrow: the planner learns from past days (today's traffic is history).
    hour = datetime.now(UTC).replace(minute=0, second=0, microsecond=0) + timedelta(days=1)
    window = Window(hour, hour + timedelta(hours=1))
    runner = stack.runner(progress=False)
    prewarmer = build_prewarmer(s, runner)
    prewarmer.budget, prewarmer.window = Budget(requests=5), lambda: window
    res = prewarmer.prewarm(PrewarmRequest("sim-model", "v2", "default", ("acme",)))
    assert res.cached == 1 and res.ok

    warm = c.chat.completions.with_raw_response.create(
        model="sim-model", messages=RAG, temperature=0, extra_body=DOCS,
        extra_headers={"X-Stoker-Model-Version": "v2"},
    )  # fmt: skip
    assert warm.headers["x-stoker-cache"] == "exact"  # the warm entry, not a live one
    logged = read_topic(kafka_bootstrap, topic_name("inference.requests", prefix), 7)
    (served,) = [e for e in map(decode_event, (m.value() for m in logged))
                 if isinstance(e, RequestLogged) and e.model_version == "v2"]  # fmt: skip
    assert served.cache_source == "warm"  # what the calibration of the forecast counts
    assert warm.parse().choices[0].message.content == live_text
    bare = sim.server.sim.answer_for("sim-model", QUESTION, None).text
    assert bare != live_text  # what the warmer sent before v2 logs: the question alone

    # The doc changes: the logged body inlines its old text, so it is not replayed again
    # (the key, naming the doc by id alone, could not tell a stale warm from a fresh one),
    # unless a KB change v2 told the new text (test_rewarm.py).
    Generations(redis_client).raise_doc_floor("acme", "kb/reset", 4)
    # valued by hits, as the deploy pre-warm values a cold namespace: an hour's flat history
    # alone would leave it below break-even before the doc is looked at
    plan = runner.plan(window, Budget(requests=5), tenants=["acme"], model_version="v3",
                       value_model="hits")  # fmt: skip
    assert plan.items == []
    why = "its document kb/reset changed since it was logged, and its new text is not known"
    assert any(why in sk.reason for sk in plan.skipped), plan.skipped
