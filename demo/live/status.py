"""The live demo's view of stoker.status: every job status from the topic's start, for the
deploy's --wait-like checks and the report."""

from __future__ import annotations

import faulthandler
import re
import threading
import time
import uuid

from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

from schemas.codec import decode_event
from schemas.errors import StokerError
from schemas.events import JobStatus
from stoker.settings import StokerSettings
from streams.topics import TOPICS, consumer_config, ensure_topics, topic_name

_RETIRED = re.compile(r"retired \S+@(\S+) ")


class StatusFollower:
    """Reads stoker.status from the start into a list (for --wait-like checks and the plots)."""

    def __init__(self, settings: StokerSettings) -> None:
        bootstrap = settings.kafka_bootstrap or ""
        group = f"demo-status-{uuid.uuid4().hex[:6]}"
        topic = topic_name("stoker.status", settings.topic_prefix)
        ensure_topics(bootstrap, {topic: TOPICS["stoker.status"]})
        self._c = Consumer(consumer_config(bootstrap, group, embedded=True))
        # assigned, not subscribed: no group join, and no wait for a metadata refresh (5 min by
        # default) when the topic appeared after the subscription; one partition, from the start
        self._c.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
        self.seen: list[tuple[float, JobStatus]] = []
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, name="demo-status", daemon=True)
        self._t.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            for m in self._c.consume(100, timeout=0.1):
                if m.error() is None:
                    ev = decode_event(m.value() or b"")
                    if isinstance(ev, JobStatus):
                        self.seen.append((time.time(), ev))
        self._c.close()

    def wait_for(self, job_id: str, states: tuple[str, ...], timeout_s: float) -> JobStatus:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for _, st in reversed(self.seen):
                if st.job_id == job_id and st.state in (*states, "failed"):
                    if st.state == "failed":
                        raise StokerError(f"deploy job {job_id} failed: {st.detail}")
                    return st
            self._stop.wait(0.05)
        seen = [f"{st.state}:{st.detail}" for _, st in self.seen if st.job_id == job_id]
        faulthandler.dump_traceback(all_threads=True)  # where it is stuck, for the bug report
        raise StokerError(
            f"deploy job {job_id} did not reach {states} in {timeout_s:.0f} s; seen: {seen}"
        )

    def retired(self) -> set[str]:
        """Model versions a deploy job has retired (its status reads "retired model@version")."""
        out = set()
        for _, st in list(self.seen):
            m = _RETIRED.search(st.detail)
            if m:
                out.add(m.group(1))
        return out

    def close(self) -> None:
        self._stop.set()
        self._t.join(10)
