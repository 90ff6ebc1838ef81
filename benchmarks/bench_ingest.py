"""Traffic-worker ingest against raw confluent-kafka batch consume + orjson decode, same topic, same run.

ratio = stoker events/s / raw events/s (goals: >= 0.5 and >= 100k events/s). Both read the same
pre-produced events from the embedded broker in their own consumer group; each is timed from the
end of its first batch to its Nth event, so the group join (~1.5 s on Tansu) counts for neither.
TAIL_BATCHES more batches follow the N in the topic, so neither side waits at the end of the
stream: a consume that finds fewer records than it asks for waits out its timeout (0.25 s), and
the traffic worker settles its last batch only after one more consume. At the end of the topic
that cost the worker two timeouts and raw one, against ~2 s of timed reading at N = 300k.
Rounds alternate raw and stoker and the medians are reported: on this 2-core box one run of
either swings by +-25% (the broker, redis-server and the worker share the cores).
Two traffic shapes are measured (SHAPES): live, the headline, and a week-long replay.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
import uuid
from collections.abc import Callable
from typing import Any

import orjson
from _common import emit
from confluent_kafka import Consumer, Producer

from schemas.codec import decode_event
from stoker.embedded import EmbeddedStack
from stoker.settings import StokerSettings
from stoker.wiring import build_redis, worker_config
from streams.topics import consumer_config, ensure_topics, producer_config
from streams.worker import Worker, WorkerStats
from warmers.traffic.profile import TrafficProfile
from warmers.traffic.worker import TrafficHandler

# The same batch size for both sides: the traffic worker's (STOKER_WORKER_BATCH_SIZE overrides).
BATCH = StokerSettings().worker_batch_size or TrafficHandler.batch_size
TIMEOUT_S = 300.0


def make_events(n: int, seed: int = 7, span_hours: int = 168) -> list[bytes]:
    """Zipf-like traffic: 20 tenants, 2 models, 20k distinct prompts, a week in time order.

    Time order as a gateway (or a replayed log) produces it: a batch spans a few hours of the
    week, not all 168, which is what makes per-batch aggregation pay."""
    rng = random.Random(seed)
    prompts = [f"how do I reset my password for product {i}?" for i in range(20_000)]
    weights = [1.0 / (i + 1) for i in range(len(prompts))]
    picks = rng.choices(range(len(prompts)), weights=weights, k=n)
    out = []
    for i, p in enumerate(picks):
        miss = rng.random() < 0.3
        out.append(
            orjson.dumps(
                {
                    "type": "request_logged",
                    "schema_version": 1,
                    "event_id": uuid.UUID(int=rng.getrandbits(128)).hex,
                    "ts": f"2025-03-{3 + i * span_hours // n // 24:02d}T"
                    f"{i * span_hours // n % 24:02d}:"
                    f"{i * span_hours * 60 // n % 60:02d}:{rng.randrange(60):02d}.123456Z",
                    "request_id": f"r{i}",
                    "tenant": f"tenant-{p % 20}",
                    "model_id": f"llama-{p % 2}",
                    "model_version": "v1",
                    "template_version": "t1",
                    "prompt": prompts[p],
                    "params": {"temperature": 0.7 if rng.random() < 0.05 else 0.0},
                    "context_docs": [{"doc_id": f"kb-{p % 50}", "version": 3}],
                    "cache_outcome": "miss" if miss else "exact",
                    "latency_ms": 420.0 if miss else 3.0,
                    "gpu_ms": 400.0 if miss else 0.0,
                    "tokens_in": 40,
                    "tokens_out": 120 if miss else 0,
                    "route": "/v1/chat/completions",
                }
            )
        )
    decode_event(out[0])  # the generator must produce valid events
    return out


def produce(bootstrap: str, topic: str, events: list[bytes]) -> None:
    p = Producer(producer_config(bootstrap, embedded=True, **{"linger.ms": 5}))
    for i, value in enumerate(events):
        while True:
            try:
                p.produce(topic, value=value, key=str(i).encode())
                break
            except BufferError:
                p.poll(0.05)
    assert p.flush(60) == 0


def raw_rate(bootstrap: str, topic: str, n: int, batch: int) -> float:
    c = Consumer(consumer_config(bootstrap, f"raw-{uuid.uuid4().hex[:6]}", embedded=True))
    c.subscribe([topic])
    seen, first_at, first_n = 0, None, 0
    deadline = time.monotonic() + TIMEOUT_S
    try:
        while seen < n and time.monotonic() < deadline:
            msgs = c.consume(num_messages=min(batch, n - seen), timeout=0.25)
            for m in msgs:
                orjson.loads(m.value())
            seen += len(msgs)
            if msgs and first_at is None:
                first_at, first_n = time.perf_counter(), seen
    finally:
        c.close()
    assert seen >= n and first_at is not None, f"raw consumer saw {seen} of {n}"
    return (seen - first_n) / (time.perf_counter() - first_at)


def stoker_rate(
    stack: EmbeddedStack,
    topic_prefix: str,
    n: int,
    batch: int,
    handler_of: Callable[[TrafficProfile], TrafficHandler] = TrafficHandler,
) -> float:
    """Events/s of the traffic worker (its handler made by `handler_of`) over `n` events,
    from the end of its first batch."""
    settings = stack.settings(
        kafka_broker="tansu", topic_prefix=topic_prefix, worker_batch_size=batch
    )
    handler = handler_of(TrafficProfile(build_redis(settings)))
    group = f"stoker-bench-{uuid.uuid4().hex[:6]}"  # fresh per round
    worker = Worker(handler, worker_config(settings, handler, group))
    marks: dict[str, float] = {}

    def done(s: WorkerStats) -> bool:
        if s.batches and "first" not in marks:
            marks["first"], marks["first_n"] = time.perf_counter(), s.events
        return s.events + s.dlq >= n

    assert worker.run_until(done, TIMEOUT_S), f"worker saw {worker.stats}"
    elapsed = time.perf_counter() - marks["first"]
    assert worker.stats.dlq == 0
    return (worker.stats.events - marks["first_n"]) / elapsed


# name -> hours the timestamps cover. "live": a gateway's stream, every event in the current
# hour (at 100k events/s an hour holds 360M of them). "replay": the same events spread over a
# week, as `stoker replay --speed max` of a small log gives them: ~1.8k events per hour, so a
# batch writes about twice the profile fields per event (fewer repeats per hour to aggregate).
SHAPES = {"ingest_traffic": 1, "ingest_traffic_replay": 168}


# Batches produced after the timed events (module docstring).
TAIL_BATCHES = 2


def measure(
    stack: EmbeddedStack, events: list[bytes], n: int, rounds: int, batch: int
) -> dict[str, Any]:
    prefix = f"bench{uuid.uuid4().hex[:6]}."
    topic = f"{prefix}inference.requests"
    ensure_topics(stack.kafka_bootstrap, {topic: 6})
    produce(stack.kafka_bootstrap, topic, events)
    r = build_redis(stack.settings())
    raw: list[float] = []
    ours: list[float] = []
    for _ in range(rounds):
        # Each round reads the topic from the start in fresh groups. The profile is emptied
        # first: its exactly-once watermarks would otherwise refuse the re-read (cheaper).
        r.flushdb()
        raw.append(raw_rate(stack.kafka_bootstrap, topic, n, batch))
        ours.append(stoker_rate(stack, prefix, n, batch))
    r.close()
    return {
        "events_per_s": round(statistics.median(ours)),
        "raw_events_per_s": round(statistics.median(raw)),
        "events_per_s_rounds": [round(x) for x in ours],
        "raw_events_per_s_rounds": [round(x) for x in raw],
        "ratio": round(statistics.median(ours) / statistics.median(raw), 3),
    }


Measure = Callable[[EmbeddedStack, list[bytes], int, int, int], dict[str, Any]]


def run_shapes(measure: Measure, suffix: str = "", **goals: Any) -> None:
    """The ingest benchmarks' command line: per shape, its events measured `--rounds` times on
    one embedded stack (`measure(stack, events, n, rounds, batch)`: the first n of the events
    timed, TAIL_BATCHES more behind them), one JSON line each, named
    `<shape><suffix>`, with `goals` after the figures."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--events", type=int, default=300_000)
    ap.add_argument("--rounds", type=int, default=3, help="raw/stoker pairs; medians reported")
    ap.add_argument("--shape", choices=["all", *SHAPES], default="all")
    args = ap.parse_args()
    # Both sides are timed from the end of their first batch: keep a few batches per run.
    batch = max(1, min(BATCH, args.events // 4))
    with EmbeddedStack() as stack:
        for name, span_hours in SHAPES.items():
            if args.shape not in ("all", name):
                continue
            events = make_events(args.events + TAIL_BATCHES * batch, span_hours=span_hours)
            emit(
                f"{name}{suffix}",
                events=args.events,
                span_hours=span_hours,
                batch_size=batch,
                rounds=args.rounds,
                **measure(stack, events, args.events, args.rounds, batch),
                **goals,
            )


def main() -> None:
    run_shapes(measure, goal_ratio_min=0.5, goal_events_per_s_min=100_000)


if __name__ == "__main__":
    main()
