"""The traffic profile's and its worker's options: the owner of the traffic_* settings'
defaults and bounds (stoker/options.py). The defaults are the constants beside the code that
uses them (profile.py, event_time.py), with their why."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from warmers.traffic.event_time import DEFAULT_MAX_AGE_S, DEFAULT_MAX_SKEW_S, EventTimes
from warmers.traffic.profile import HOUR_CAPACITY, RETENTION_WEEKS, WEEK_CAPACITY


class TrafficOptions(BaseModel):
    """What TrafficProfile keeps and which event times the traffic worker learns from."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    retention_weeks: int = Field(default=RETENTION_WEEKS, ge=1, le=52)
    week_capacity: int = Field(default=WEEK_CAPACITY, ge=1, le=1_000_000)
    hour_capacity: int = Field(default=HOUR_CAPACITY, ge=1, le=1_000_000)
    max_clock_skew_s: float = Field(default=DEFAULT_MAX_SKEW_S, ge=0, le=86_400)
    # None: any age (a replay on a simulated clock)
    max_event_age_s: float | None = Field(default=DEFAULT_MAX_AGE_S, gt=0)

    def event_times(self) -> EventTimes:
        return EventTimes(self.max_clock_skew_s, self.max_event_age_s)
