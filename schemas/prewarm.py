"""What a deploy's pre-warm is asked to do: one type for the cutover that asks (invalidators/)
and every pre-warmer that answers (warmers/, the demo's wrappers), so that the four fields are
written once and not again in each `prewarm` signature. It lives here, the lowest layer, because
the cutover and the warmers may not import each other."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class PrewarmRequest:
    """Warm `version` of `model_id` before it serves; `previous_version` is what serves now
    (None on a first deploy); `tenants` None or empty: every tenant in the traffic profile."""

    model_id: str
    version: str
    previous_version: str | None = None
    tenants: tuple[str, ...] | None = None
