"""Which threshold and TTL to run with, and whether caching is worth building at all.

Threshold, with labels: the one with the best total hit rate (at the longest TTL) among those
whose false-hit share stays within the bound at every TTL; none qualifies -> exact only.
Without labels there is no way to see wrong answers, so the advice is conservative: the first
listed threshold >= 0.95 (DESIGN notes measured 2/20 wrong answers at 0.92 on MiniLM).
TTL: the shortest whose GPU-seconds saved reach 90% of the best TTL's at that threshold. The
TTL is the staleness guarantee (invalidation is best effort), so hours past that point buy
little and cost correctness risk. Only TTLs up to GENERATION_TTL_S (7 d) are recommended: an
entry must not outlive the generation keys that refuse its stale twin (caches/constants.py).
Verdict: under 15% of traffic served from cache at those settings, caching is probably not
the fix (practitioners' rule of thumb: "measure before you build").
"""

from __future__ import annotations

from typing import Any

from caches.constants import GENERATION_TTL_S

UNLABELLED_THRESHOLD = 0.95
TTL_KEEP = 0.9
VERDICT_BAR = 0.15


def recommend(
    grid: list[dict[str, Any]],
    thresholds: tuple[float, ...],
    ttls_s: tuple[int, ...],
    max_false_share: float,
    labelled: bool,
) -> dict[str, Any]:
    """{"threshold": float | None (None = exact only), "ttl_s", "labelled", "reason"}."""
    cell = {(g["threshold"], g["ttl_s"]): g["overall"] for g in grid}
    safe = tuple(t for t in ttls_s if t <= GENERATION_TTL_S) or ttls_s
    if labelled:
        thr, why = _labelled_threshold(cell, thresholds, safe, max_false_share)
    else:
        above = [t for t in thresholds if t >= UNLABELLED_THRESHOLD]
        thr = min(above) if above else max(thresholds)
        why = (
            "unlabelled: false hits cannot be measured, so a conservative threshold; "
            "pass --labels to pick one by measured false hits"
        )
    best = max(cell[(thr, ttl)]["gpu_seconds_saved"] for ttl in safe)
    ttl = min(t for t in safe if cell[(thr, t)]["gpu_seconds_saved"] >= TTL_KEEP * best)
    why += f"; TTL: the shortest saving >= {TTL_KEEP:.0%} of the best one's GPU time"
    if any(t > GENERATION_TTL_S for t in safe):
        why += f" (every TTL tried outlives the {GENERATION_TTL_S} s generation keys: shorten it)"
    elif safe != ttls_s:
        why += f", among TTLs <= {GENERATION_TTL_S} s (longer ones outlive the generation keys)"
    return {"threshold": thr, "ttl_s": ttl, "labelled": labelled, "reason": why}


def _labelled_threshold(
    cell: dict[tuple[float | None, int], dict[str, Any]],
    thresholds: tuple[float, ...],
    ttls_s: tuple[int, ...],
    max_false_share: float,
) -> tuple[float | None, str]:
    ok = [
        t
        for t in thresholds
        if all(cell[(t, ttl)]["false_hit_share"] <= max_false_share for ttl in ttls_s)
    ]
    # the best hit rate at the longest TTL; on a tie the higher (safer) threshold
    longest = max(ttls_s)
    thr = max(ok, key=lambda t: (cell[(t, longest)]["hit_rate_total"], t), default=None)
    if thr is None:
        return None, f"every threshold served > {max_false_share:.1%} wrong answers: exact only"
    return thr, f"best hit rate with false-hit share <= {max_false_share:.1%} at every TTL"


def verdict(hit_rate_total: float) -> dict[str, Any]:
    worth = hit_rate_total >= VERDICT_BAR
    text = (
        f"{hit_rate_total:.1%} of requests would be served from cache: caching pays"
        if worth
        else f"only {hit_rate_total:.1%} of requests would be served from cache (under "
        f"{VERDICT_BAR:.0%}): caching is probably not your fix"
    )
    return {
        "worth_caching": worth,
        "basis": "hit_rate_total at the recommended threshold and TTL",
        "hit_rate_total": hit_rate_total,
        "bar": VERDICT_BAR,
        "text": text,
    }
