"""The traffic worker: RequestLogged events from inference.requests into the traffic profile.

Decoding is the hot path (one event per served request): warmers.traffic.decode decodes with
msgspec and falls back to decode_event for anything it is unsure of (poison keeps decode_event's
reason), and warmers.traffic.count_batch counts a batch while decoding it, without an object per event.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Protocol

from confluent_kafka import Message

from schemas.common import utcnow
from streams.base import Decoded, Handler
from streams.metrics import count_gateway_outcomes
from warmers.traffic.count_batch import BatchTally, observe_batch
from warmers.traffic.decode import OUTCOMES, observe_event
from warmers.traffic.delta import Observation, TenantDelta
from warmers.traffic.event_time import EventTimes, TimeWindow
from warmers.traffic.profile import TrafficProfile

__all__ = ["TrafficBatch", "TrafficHandler", "observe_event"]


class WarmHits(Protocol):
    """Where the hits of warmed entries are credited (warmers/hotset/calibration.py's
    Calibration): declared here so that the traffic stage imports nothing of the hot set."""

    def hits(self, warm_hits: Mapping[str, Sequence[tuple[str, float]]]) -> int: ...


@dataclass(frozen=True)
class TrafficBatch:
    """A decoded batch: its per-tenant deltas, and its records to re-read per event if a
    watermark refuses part of it (TrafficProfile.write_deltas)."""

    deltas: dict[str, TenantDelta]
    messages: Sequence[Message]
    times: TimeWindow | None = None  # what the decode accepted, for the same re-read

    def observations(self) -> list[Observation]:
        return observe_batch(self.messages, self.times)


class TrafficHandler(Handler):
    """Counts every RequestLogged once per offset into the TrafficProfile (see its docstring)."""

    name = "traffic"
    topics = ["inference.requests"]  # noqa: RUF012  (the Handler contract: a plain list)
    pipelined = True  # decode touches only self.tally, apply only self.profile
    # Profile writes per event fall as a batch aggregates more (a hot query is one field per
    # hour, however often it is asked; bench_ingest runs at this size, and docs/benchmarks.md,
    # "Ingest", has 50k against 20k). A batch holds ~50 MB of records; two are in flight.
    batch_size = 50_000
    times: EventTimes | None = None  # see __init__

    def __init__(
        self,
        profile: TrafficProfile,
        times: EventTimes | None = None,
        clock: Callable[[], datetime] = utcnow,
        calibration: WarmHits | None = None,
        *,
        close_clients: bool = True,
    ) -> None:
        """times: the event times counted, around `clock` (None: any; the shell always sets
        them, see warmers/traffic/event_time.py); the rest is dead-lettered. calibration: where the hits
        of warmed entries are credited (warmers/hotset/calibration.py; None: nowhere).
        close_clients: False when the caller shares the profile's Redis (the shell's Stack)."""
        self.profile = profile
        self._close_clients = close_clients
        self.tally = BatchTally()
        self.times = times
        self.clock = clock
        self.calibration = calibration

    def decode_batch(self, messages: Sequence[Message]) -> Decoded:
        """Decoded.items is [TrafficBatch] (or [] when nothing was good); .aggregated counts."""
        out = Decoded(tally=dict.fromkeys(OUTCOMES, 0))
        window = None if self.times is None else self.times.at(self.clock())
        deltas, good = self.tally.add(messages, out, window)
        out.aggregated = good
        if good:
            out.items.append(TrafficBatch(deltas, messages, window))
        return out

    def apply_decoded(self, decoded: Decoded) -> None:
        for batch in decoded.items:
            self.profile.write_deltas(batch.deltas, batch.observations)
            warm = {t: d.warm_hits for t, d in batch.deltas.items() if d.warm_hits}
            if warm and self.calibration is not None:  # each hit credited once (a note each)
                self.calibration.hits(warm)

    def settled(self, decoded: Decoded) -> None:
        count_gateway_outcomes(decoded.tally)

    def close(self) -> None:
        if self._close_clients:
            self.profile.r.close()
