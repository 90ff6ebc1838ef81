"""Traffic ingest with 1 and with 2 worker processes in one consumer group, same broker, same run.

ratio = events/s with 2 members / events/s with 1 (goal >= 1.3 on this 2-core machine, where
Tansu and redis-server share the cores with the workers). Each member is a process of its own
(one Python interpreter each: threads would share one GIL), running the traffic worker as
`stoker worker traffic` does. Per round and member count: the profile is emptied, the members
start in a fresh group on the pre-produced topic, and the group is timed once every member
owns partitions, from the first commit after that to the first commit at which it has counted
--events (events committed before the group settled count for neither side). More events
follow those in the topic, TAIL_BATCHES batches for each member (bench_ingest says why), so no
member waits at the end of the stream while the other still counts. Rounds alternate 1 and 2
members; medians are reported, because one run swings by +-25% here.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import statistics
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Any

from _common import emit
from bench_ingest import BATCH, TAIL_BATCHES, make_events, produce

from stoker.embedded import EmbeddedStack
from stoker.settings import StokerSettings
from stoker.wiring import build_redis, worker_config
from streams.topics import ensure_topics
from streams.worker import Worker
from warmers.traffic.profile import TrafficProfile
from warmers.traffic.worker import TrafficHandler

PARTITIONS = 6  # 3 each for 2 members: no member owns more of the work than the other
MEMBERS = (1, 2)  # the group sizes compared
TIMEOUT_S = 300.0
_REPORT_S = 0.005  # how often a member copies its counters to shared memory


def member(fields: dict[str, Any], group: str, slot: int, shared: Any, stop: Any) -> None:
    """One worker process: run the traffic worker; publish (assigned, commits) as it goes.

    shared[slot] = [partitions owned, events committed, time.time() of the last commit]."""
    settings = StokerSettings(**fields)
    handler = TrafficHandler(TrafficProfile(build_redis(settings)))
    worker = Worker(handler, worker_config(settings, handler, group))

    def report() -> None:
        while not stop.is_set():
            s = worker.stats
            at = s.last_batch_at or 0.0
            shared[3 * slot : 3 * slot + 3] = [len(s.assigned), s.events, at]
            stop.wait(_REPORT_S)

    reporter = threading.Thread(target=report, daemon=True)
    reporter.start()
    worker.run_until(lambda _: stop.is_set(), TIMEOUT_S)


@dataclass
class Sample:
    at: float
    rows: list[tuple[int, int, float]]  # per member: owned, events, last commit time

    @property
    def settled(self) -> bool:
        owned = [r[0] for r in self.rows]
        return all(owned) and sum(owned) == PARTITIONS

    @property
    def events(self) -> int:
        return sum(r[1] for r in self.rows)


def group_rate(fields: dict[str, Any], members: int, n: int) -> float:
    """Events/s of `members` processes over the steady part of one pass through n events."""
    ctx = mp.get_context("spawn")
    shared, stop = ctx.Array("d", 3 * members, lock=False), ctx.Event()
    group = f"scaling-{uuid.uuid4().hex[:6]}"
    procs = [
        ctx.Process(target=member, args=(fields, group, i, shared, stop)) for i in range(members)
    ]
    for p in procs:
        p.start()
    samples: list[Sample] = []
    deadline = time.monotonic() + TIMEOUT_S
    try:
        while time.monotonic() < deadline:
            rows = [(int(shared[3 * i]), int(shared[3 * i + 1]), shared[3 * i + 2])
                    for i in range(members)]  # fmt: skip
            samples.append(Sample(time.time(), rows))
            if samples[-1].events >= n:
                break
            time.sleep(_REPORT_S)
    finally:
        stop.set()
        for p in procs:
            p.join(60)
    return _steady_rate(samples, n)


def _steady_rate(samples: list[Sample], n: int) -> float:
    """From the first commit after the group settled to the first commit that counts n."""
    assert samples and samples[-1].events >= n, "the group did not count every event"
    settled_at = next(s.at for s in samples if s.settled)
    after = [s for s in samples if s.at > settled_at]
    # The first commit after settling: a sample whose newest commit time is past settled_at.
    start = next(s for s in after if max(r[2] for r in s.rows) > settled_at)
    t0 = max(r[2] for r in start.rows)
    t1 = max(r[2] for r in samples[-1].rows)
    assert t1 > t0, "one batch was the whole steady part: use more events"
    return (samples[-1].events - start.events) / (t1 - t0)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--events", type=int, default=600_000)
    ap.add_argument("--rounds", type=int, default=3, help="1/2-member pairs; medians reported")
    args = ap.parse_args()
    batch = max(1, min(BATCH, args.events // 12))  # several commits per member and pass
    load_before = os.getloadavg()[0]  # anything else running on the 2 cores skews the ratio
    with EmbeddedStack() as stack:
        prefix = f"scaling{uuid.uuid4().hex[:6]}."
        topic = f"{prefix}inference.requests"
        ensure_topics(stack.kafka_bootstrap, {topic: PARTITIONS})
        tail = TAIL_BATCHES * batch * max(MEMBERS)
        produce(stack.kafka_bootstrap, topic, make_events(args.events + tail))
        fields = {
            "kafka_bootstrap": stack.kafka_bootstrap,
            "redis_url": stack.redis_url,
            "kafka_broker": "tansu",
            "topic_prefix": prefix,
            "worker_batch_size": batch,
        }
        r = build_redis(StokerSettings(**fields))
        rates: dict[int, list[float]] = {m: [] for m in MEMBERS}
        for _ in range(args.rounds):
            for members in MEMBERS:
                r.flushdb()  # the profile's watermarks would refuse the re-read otherwise
                rates[members].append(group_rate(fields, members, args.events))
        r.close()
    one, two = statistics.median(rates[1]), statistics.median(rates[2])
    emit(
        "ingest_scaling",
        events=args.events,
        partitions=PARTITIONS,
        batch_size=batch,
        rounds=args.rounds,
        events_per_s_1=round(one),
        events_per_s_2=round(two),
        events_per_s_1_rounds=[round(x) for x in rates[1]],
        events_per_s_2_rounds=[round(x) for x in rates[2]],
        ratio=round(two / one, 3),
        goal_ratio_min=1.3,
        load_avg_1m_before=round(load_before, 2),
        cpus=os.cpu_count(),
    )


if __name__ == "__main__":
    main()
