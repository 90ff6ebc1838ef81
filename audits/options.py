"""The wrong-hit monitor's options (audits/monitor.py runs them): how much of the served traffic
it re-asks, how fast, and when it keeps off the backend. Its own module, light to import, so
that the settings (which point the monitor_* settings here) do not load the monitor itself."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from backends.pacing import AimdConfig


class MonitorOptions(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    # of served semantic hits (STOKER_MONITOR_SHARE)
    share: float = Field(default=0.2, ge=0.0, le=1.0)
    # re-asks per second at most (STOKER_MONITOR_QPS)
    qps: float = Field(default=2.0, gt=0)
    probe_ttl_s: float = Field(default=86_400.0, gt=0)
    # of the exact hits served within stale_window_s after a change in their tenant
    # (STOKER_MONITOR_STALE_SHARE, STOKER_MONITOR_STALE_WINDOW_S)
    stale_share: float = Field(default=0.2, ge=0.0, le=1.0)
    stale_window_s: float = Field(default=3_600.0, gt=0)
    # drop a sample while the backend's load is at or over this (STOKER_MONITOR_BUSY_LOAD);
    # None: re-ask at any load, within the cap
    busy_load: float | None = Field(default=0.5, gt=0.0, le=1.0)
    aimd: AimdConfig = Field(default_factory=AimdConfig)
