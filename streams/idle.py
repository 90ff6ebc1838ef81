"""The rest between fetches of an idle consumer on the embedded broker: grows while quiet, gone on data.

Why a rest at all: Tansu (0.6) holds every fetch for fetch.wait.max.ms and only then answers,
data or not: it does not long-poll as Kafka does, which answers as soon as data comes. With
the 10 ms wait that keeps end-to-end latency at ~4 ms (streams/topics.py) each consumer sends
~100 fetches a second forever, and an idle `stoker gateway` kept Tansu at 24% of a core; a
longer wait would delay every batch under load by as much. So the wait stays short, and a
consumer whose topics have been quiet pauses its partitions between fetches instead (the
figures are in docs/benchmarks.md, `idle_cpu`). Real Kafka needs none of this: its consumers
long-poll at no cost, so the worker rests on the embedded broker only.
"""

from __future__ import annotations

import time
from collections.abc import Callable

# A rest shorter than this saves a handful of 10 ms fetches and costs a pause, a resume and a
# metadata request: not worth taking.
MIN_REST_S = 0.05


class IdleRest:
    """Half the time the topics have been quiet, up to `max_s`: a topic quiet for a second
    waits at most half a second longer for its next record. Not thread-safe (one per worker)."""

    def __init__(self, max_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.max_s = max_s
        self._clock = clock
        self._data_at = clock()

    def saw(self, records: int) -> None:
        """After each consume: any record ends the quiet, so the next consume rests no more."""
        if records:
            self._data_at = self._clock()

    def reset(self) -> None:
        """New partitions (a rebalance) are not known to be quiet: fetch them at once."""
        self._data_at = self._clock()

    def rest_s(self) -> float:
        """How long to pause before the next fetch; 0: fetch now."""
        rest = min(self.max_s, (self._clock() - self._data_at) / 2)
        return rest if rest >= MIN_REST_S else 0.0
