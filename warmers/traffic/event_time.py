"""The event times the traffic worker learns from: bounded by its own clock, both ways.

A producer with a wrong clock (or a hostile one) must not steer the profile: four events dated
2999 once made the newest weeks of a tenant's profile the attacker's, and its real week fell
out of the retained ones. So an event is counted only if its `ts` lies between `max_age_s`
before the worker's clock and `max_skew_s` after it; any other goes to the dead-letter topic
with dlq.reason "ts_in_future" or "ts_too_old". The profile's retention follows the clock too
(TrafficProfile.weeks), so what is accepted can never push real weeks out.

The check is cheap on the hot path: the batch tally asks `covers(hour)` once per hour of event
time it meets, and compares single events only in an hour that straddles a bound.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Final

from schemas.errors import EventDecodeError

# NTP keeps servers within milliseconds of each other; 5 minutes covers a VM whose clock
# drifted or a gateway that buffered its log, never a wrong day.
DEFAULT_MAX_SKEW_S: Final = 300.0
# A year and a day: a replayed log of last year's traffic is still learned from (stoker replay
# keeps each event's own time), while a producer whose clock reads 1970 is dead-lettered.
DEFAULT_MAX_AGE_S: Final = 366 * 86_400.0
_EARLIEST: Final = datetime.min.replace(tzinfo=UTC)


@dataclass(frozen=True)
class EventTimes:
    """The accepted span around a clock: max_skew_s into the future, max_age_s into the past
    (None: no bound on the past, for replays of old logs on a simulated clock: the demo)."""

    max_skew_s: float = DEFAULT_MAX_SKEW_S
    max_age_s: float | None = DEFAULT_MAX_AGE_S

    def at(self, now: datetime) -> TimeWindow:
        """The window of one batch: fixed when it is decoded, so a re-read (after a watermark
        refusal) accepts exactly what the first read did."""
        now = now if now.tzinfo else now.replace(tzinfo=UTC)
        earliest = _EARLIEST if self.max_age_s is None else _minus(now, self.max_age_s)
        return TimeWindow(now, earliest, now + timedelta(seconds=self.max_skew_s), self)


@dataclass(frozen=True)
class TimeWindow:
    """[earliest, latest] in aware UTC; naive times are UTC, as everywhere in the events."""

    now: datetime
    earliest: datetime
    latest: datetime
    bounds: EventTimes

    def covers(self, lo: datetime | None, hi: datetime | None) -> bool:
        """Whether every time in [lo, hi) is accepted (lo and hi of one kind, naive = UTC)."""
        if lo is None or hi is None:
            return False
        return self.earliest <= aware(lo) and aware(hi) <= self.latest

    def refusal(self, ts: datetime) -> EventDecodeError | None:
        """The dead-letter reason for an event at `ts`, or None when it is accepted."""
        t = aware(ts)
        if t > self.latest:
            ahead = (t - self.now).total_seconds()
            return EventDecodeError(
                "ts_in_future",
                f"ts {t.isoformat()} is {_span(ahead)} ahead of this worker's clock "
                f"({self.now.isoformat(timespec='seconds')}); the allowance is "
                f"{self.bounds.max_skew_s:g} s",
            )
        if t < self.earliest:
            behind = (self.now - t).total_seconds()
            return EventDecodeError(
                "ts_too_old",
                f"ts {t.isoformat()} is {_span(behind)} behind this worker's clock "
                f"({self.now.isoformat(timespec='seconds')}); the horizon is "
                f"{self.bounds.max_age_s:g} s",
            )
        return None


def aware(ts: datetime) -> datetime:
    """An event time as an aware one: a naive time is UTC, as the schema reads it."""
    return ts if ts.tzinfo else ts.replace(tzinfo=UTC)


def _minus(now: datetime, seconds: float) -> datetime:
    try:
        return now - timedelta(seconds=seconds)
    except OverflowError:  # a horizon past year 1: no bound
        return _EARLIEST


def _span(seconds: float) -> str:
    for unit, size in (("days", 86_400.0), ("h", 3_600.0), ("min", 60.0)):
        if seconds >= size:
            return f"{seconds / size:,.1f} {unit}"
    return f"{seconds:.1f} s"
