"""The window a hot set is chosen for: whole UTC hours, from `next-hour` or `START..END`."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta

from schemas.errors import ConfigError

# A week: the profile's cycle; a longer window would warm for days no traffic profile predicts.
MAX_WINDOW = timedelta(days=7)


def _floor_hour(ts: datetime) -> datetime:
    return ts.replace(minute=0, second=0, microsecond=0)


def _aware(ts: datetime) -> datetime:
    return ts.replace(tzinfo=UTC) if ts.tzinfo is None else ts.astimezone(UTC)


@dataclass(frozen=True)
class Window:
    """[start, end) in whole UTC hours; start < end <= start + 7 days."""

    start: datetime
    end: datetime

    def __post_init__(self) -> None:
        if self.start.tzinfo is None or self.end.tzinfo is None:
            raise ConfigError("window bounds must be timezone-aware")
        if _floor_hour(self.start) != self.start or _floor_hour(self.end) != self.end:
            raise ConfigError("window bounds must be whole hours")
        if not self.start < self.end <= self.start + MAX_WINDOW:
            raise ConfigError(f"window must be 1 hour to 7 days long, got {self.start}..{self.end}")

    @classmethod
    def next_hour(cls, now: datetime | None = None) -> Window:
        start = _floor_hour(_aware(now or datetime.now(UTC))) + timedelta(hours=1)
        return cls(start, start + timedelta(hours=1))

    @classmethod
    def from_this_hour(cls, hours: int, now: datetime | None = None) -> Window:
        """The hour under way and the `hours` - 1 after it: the first hours after a cutover
        that happens now (the hour under way counts whole)."""
        start = _floor_hour(_aware(now or datetime.now(UTC)))
        return cls(start, start + timedelta(hours=hours))

    @classmethod
    def parse(cls, spec: str, now: datetime | None = None) -> Window:
        """`next-hour`, or `START..END` in ISO 8601 (naive = UTC); START rounds down to its
        hour and END up, so `10:30..11:10` warms 10:00-12:00."""
        if spec == "next-hour":
            return cls.next_hour(now)
        head, sep, tail = spec.partition("..")
        if not sep:
            raise ConfigError(f"window {spec!r}: want next-hour or START..END")
        try:
            start, end = _aware(datetime.fromisoformat(head)), _aware(datetime.fromisoformat(tail))
        except ValueError as e:
            raise ConfigError(f"window {spec!r}: {e}") from e
        end_h = _floor_hour(end)
        return cls(_floor_hour(start), end_h if end_h == end else end_h + timedelta(hours=1))

    def hours(self) -> int:
        return int((self.end - self.start).total_seconds() // 3600)

    def slots(self) -> list[tuple[date, int]]:
        """(UTC day, hour of day) of every hour in the window, in order."""
        out = []
        for i in range(self.hours()):
            ts = self.start + timedelta(hours=i)
            out.append((ts.date(), ts.hour))
        return out

    def __str__(self) -> str:
        return f"{self.start:%Y-%m-%d %H:%M}..{self.end:%Y-%m-%d %H:%M} UTC"
