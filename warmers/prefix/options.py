"""What the prefixes worker tracks and when the scheduler sends the hot prefixes: the owner of
those settings' defaults and bounds (stoker/options.py). A run's send options (its budget, pace
and deadline) are PrefixWarmOptions' (warm.py)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from warmers.prefix.before_peak import DEFAULT_LEAD_S
from warmers.prefix.hot import DEFAULT_CAPACITY, MIN_PREFIX_TOKENS


class PrefixOptions(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    # system prompts tracked per tenant and model (space-saving), and the shortest counted
    capacity: int = Field(default=DEFAULT_CAPACITY, ge=1, le=100_000)
    min_tokens: int = Field(default=MIN_PREFIX_TOKENS, ge=1, le=1_000_000)
    # how long before each day's busiest hour the scheduler sends them again (0: never)
    before_peak_s: float = Field(default=DEFAULT_LEAD_S, ge=0, le=6 * 3600)
    # model id -> the replicas whose restarts the scheduler watches (empty: none)
    replicas: dict[str, list[str]] = Field(default_factory=dict)
