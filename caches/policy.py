"""What may be cached, for how long, and which threshold a semantic hit must clear."""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

from caches import constants as C
from schemas.common import RequestParams

# tenant (or "tenant/route") -> a semantic threshold, each a cosine in [0, 1]
Thresholds = dict[str, Annotated[float, Field(ge=0.0, le=1.0)]]


class CachePolicy(BaseModel):
    """What may be cached, for how long, and the bar a semantic hit must clear: the owner of
    these defaults (the settings of the same names point here, stoker/options.py)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    exact_ttl_s: int = Field(default=C.DEFAULT_EXACT_TTL_S, gt=0)
    semantic_ttl_s: int = Field(default=C.DEFAULT_EXACT_TTL_S, gt=0)
    negative_ttl_s: int = Field(default=C.DEFAULT_NEGATIVE_TTL_S, gt=0)
    # How long the cache remembers why an answer was not stored (cut at max_tokens, ...): the
    # repeat of the request and its look-alikes say so (not_stored) meanwhile.
    not_stored_ttl_s: int = Field(default=C.DEFAULT_NOT_STORED_TTL_S, gt=0)
    embedding_ttl_s: int = Field(default=C.DEFAULT_EMBEDDING_TTL_S, gt=0)
    max_prompt_chars: int = Field(default=32_000, gt=0)
    max_response_bytes: int = Field(default=256_000, gt=0)
    threshold: float = Field(default=0.92, ge=0.0, le=1.0)
    tenant_thresholds: Thresholds = Field(default_factory=dict)
    # Keyed "tenant/route" or "*/route"; the most specific key wins, then the tenant, then default.
    route_thresholds: Thresholds = Field(default_factory=dict)
    # Sensitive routes ("tenant/route" or "*/route"): a semantic hit there must clear
    # max(threshold, conservative_threshold) and every lexical guard, whatever the matcher says.
    # 0.95 serves fewer wrong hits than 0.92 (bench_semantic_quality; docs/benchmarks.md,
    # "Semantic quality", has the eval's figures).
    conservative_routes: frozenset[str] = frozenset()
    conservative_threshold: float = Field(default=0.95, ge=0.0, le=1.0)

    def threshold_for(self, tenant: str, route: str | None = None) -> float:
        thr = self.tenant_thresholds.get(tenant, self.threshold)
        if route is not None:
            thr = self.route_thresholds.get(
                f"{tenant}/{route}", self.route_thresholds.get(f"*/{route}", thr)
            )
        if self.conservative_for(tenant, route):
            thr = max(thr, self.conservative_threshold)
        return thr

    def conservative_for(self, tenant: str, route: str | None = None) -> bool:
        if route is None:
            return False
        return f"{tenant}/{route}" in self.conservative_routes or (
            f"*/{route}" in self.conservative_routes
        )


def request_bypass_reason(params: RequestParams) -> str | None:
    """Why a request must never be cached, or None. Sampling makes every answer a new one."""
    if params.no_cache:
        return "no-cache"
    if params.temperature > 0:
        return "temperature>0"
    return None


# C0 controls but tab, newline and carriage return, and DEL: no person types them, so a prompt
# holding one is binary data or a client bug, and its nearest neighbours in embedding space are
# arbitrary (a semantic hit would serve another question's answer).
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")


def prompt_bypass_reason(prompt: str) -> str | None:
    """Why a prompt must never be cached, or None: empty (every empty prompt of a namespace
    would share one answer) or holding control characters (NUL, ...)."""
    if not prompt or prompt.isspace():
        return "empty prompt"
    if _CONTROL.search(prompt) is not None:
        return "prompt holds control characters"
    return None


# Answers that ended on their own: "stop", or a call of the caller's tools. Anything else
# ("length", "content_filter", a stream cut short) is a truncated or altered answer.
COMPLETE_FINISHES = frozenset({"stop", "tool_calls"})


def response_refusal_reason(
    response: str,
    *,
    is_error: bool,
    max_bytes: int,
    finish_reason: str = "stop",
    has_tool_calls: bool = False,
) -> str | None:
    """Why an answer must not be stored, or None."""
    if is_error:
        return "error response"
    if finish_reason not in COMPLETE_FINISHES:
        return f"incomplete answer (finish_reason {finish_reason})"
    if not response.strip() and not has_tool_calls:
        return "empty response"
    try:
        size = len(response.encode())
    except UnicodeEncodeError:  # a lone surrogate ("\ud800"): not text, and no JSON holds it
        return "response is not valid Unicode text"
    if size > max_bytes:
        return f"response over {max_bytes} bytes"
    return None


def not_stored_why(finish_reason: str, refusal: str) -> str:
    """What a later miss says about an answer refused for `refusal` (response_refusal_reason):
    how it ended when it did not end on its own ("finish_reason=length"), else the refusal."""
    if finish_reason not in COMPLETE_FINISHES:
        return f"finish_reason={finish_reason}"
    return refusal
