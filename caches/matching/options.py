"""The verified matcher's options: the owner of their settings' defaults and bounds
(stoker/options.py). What each one means is said where the settings point at them
(stoker/settings.py, the cache policy section) and in the modules that use them."""

from __future__ import annotations

from typing import Final

from pydantic import BaseModel, ConfigDict, Field

from caches.constants import DEFAULT_BUDGET_WINDOW_S
from caches.matching.answers import DEFAULT_ANSWER_BAR
from caches.matching.error_budget import DEFAULT_REFRESH_S

# Every near miss is judged against its live answer: a check is one dot product and one
# counter write, as the verified matcher embeds every stored answer anyway.
DEFAULT_SHADOW_SHARE: Final = 1.0
# The budget's bound on the wrong-hit rate served, per tenant and route.
DEFAULT_MAX_WRONG_HIT_RATE: Final = 0.01


class MatchingOptions(BaseModel):
    """The owner of the verified matcher's and its error budget's settings."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    answer_bar: float = Field(default=DEFAULT_ANSWER_BAR, ge=-1.0, le=1.0)
    max_wrong_hit_rate: float = Field(default=DEFAULT_MAX_WRONG_HIT_RATE, gt=0.0, lt=1.0)
    budget_window_s: float = Field(default=DEFAULT_BUDGET_WINDOW_S, gt=0)
    budget_refresh_s: float = Field(default=DEFAULT_REFRESH_S, ge=0, le=3600)
    budget_shadow_share: float = Field(default=DEFAULT_SHADOW_SHARE, ge=0.0, le=1.0)
    # before neighbours and verdicts can vouch, serve the clearly safe look-alikes (cold.py)
    cold_start: bool = True
    # check that the backend's answers tell meanings apart before trusting them (calibration.py)
    answer_checks: bool = True
