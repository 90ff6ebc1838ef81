"""The figures of a replayed TTL regime: did warming pay, hour by hour and in all.

- peak_gpu_ratio: the busiest hour's GPU-seconds with warming (live misses + the warm sends
  that went out in it) over the busiest hour's without (each its own busiest hour);
- total_gpu_ratio: all GPU-seconds with warming over all without;
- warm_efficiency: of the warm sends whose entries expired inside the replay (a later one's
  life is cut off with the log), the share that served a request that missed without
  warming: a send that added a hit. A warm buys one miss (a live cache fills the entry on its
  first miss anyway), so a send that no one asks before it expires, or that only served what
  the live entry would have, adds nothing;
- extra_hits_per_send: (hits with - hits without) per send over the whole replay, which also
  counts what warming shifted (an entry that expires earlier, refilled later) and the sends
  whose life the log's end cut off;
- warm_first_hits: warmed entries that served at least one request;
- peak_gpu_ratio_bound: the lowest peak any warming could reach on this traffic, over the
  baseline's: per hour, the misses no warm could have prevented (never cacheable, or a
  request no earlier one asked: no history names it), the busiest such hour over the
  baseline's peak. Every other miss is taken to move, for free, into an idle hour: a bound,
  not a forecast's reach.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from warmers.replay.cache import HOUR_S, Hour
from warmers.replay.run import Arm


def hourly(warm: Arm, base: Arm) -> list[dict[str, Any]]:
    """One row per virtual hour of the replay, both arms side by side."""
    hours = sorted(set(warm.ledger.hours) | set(base.ledger.hours))
    if not hours:
        return []
    out = []
    for h in range(hours[0], hours[-1] + 1):
        w, b = warm.ledger.hours.get(h, Hour()), base.ledger.hours.get(h, Hour())
        out.append(
            {
                "hour": datetime.fromtimestamp(h * HOUR_S, UTC).isoformat(),
                "requests": b.requests,
                "hits": w.hits,
                "hits_baseline": b.hits,
                "gpu_s": round(w.live_gpu_s + w.send_gpu_s, 3),
                "live_gpu_s": round(w.live_gpu_s, 3),
                "send_gpu_s": round(w.send_gpu_s, 3),
                "gpu_s_baseline": round(b.live_gpu_s, 3),
                "fixed_gpu_s_baseline": round(b.fixed_gpu_s, 3),
                "sends": w.sends,
            }
        )
    return out


def regime_figures(
    warm: Arm, base: Arm, ttl_s: float, seconds: float, end: float
) -> dict[str, Any]:
    rows = hourly(warm, base)
    peak_w = max(rows, key=lambda r: r["gpu_s"], default=None)
    peak_b = max(rows, key=lambda r: r["gpu_s_baseline"], default=None)
    total_w = sum(r["gpu_s"] for r in rows)
    total_b = sum(r["gpu_s_baseline"] for r in rows)
    requests = sum(r["requests"] for r in rows)
    hits_w, hits_b = sum(r["hits"] for r in rows), sum(r["hits_baseline"] for r in rows)
    sends = sum(r["sends"] for r in rows)
    first = sum(h.warm_hits for h in warm.ledger.hours.values())
    settled = [e for e in warm.sent if e.expires <= end]
    out: dict[str, Any] = {
        "ttl_s": ttl_s,
        "hours": len(rows),
        "requests": requests,
        "peak_gpu_s": None if peak_w is None else peak_w["gpu_s"],
        "peak_hour": None if peak_w is None else peak_w["hour"],
        "peak_gpu_s_baseline": None if peak_b is None else peak_b["gpu_s_baseline"],
        "peak_hour_baseline": None if peak_b is None else peak_b["hour"],
        "peak_gpu_ratio": _ratio(
            None if peak_w is None else peak_w["gpu_s"],
            None if peak_b is None else peak_b["gpu_s_baseline"],
        ),
        "peak_gpu_ratio_bound": _ratio(
            max((r["fixed_gpu_s_baseline"] for r in rows), default=None),
            None if peak_b is None else peak_b["gpu_s_baseline"],
        ),
        "total_gpu_s": round(total_w, 1),
        "total_gpu_s_baseline": round(total_b, 1),
        "total_gpu_ratio": _ratio(total_w, total_b),
        "warm_sends": sends,
        "warm_gpu_s": round(sum(r["send_gpu_s"] for r in rows), 1),
        "extra_hits": hits_w - hits_b,
        "warm_efficiency": (
            None if not settled else round(sum(e.added for e in settled) / len(settled), 4)
        ),
        "settled_sends": len(settled),
        "extra_hits_per_send": None if not sends else round((hits_w - hits_b) / sends, 4),
        "warm_first_hits": first,
        "hit_rate": None if not requests else round(hits_w / requests, 4),
        "hit_rate_baseline": None if not requests else round(hits_b / requests, 4),
        "scheduler_runs": warm.scheduler_runs,
        "invalidated": warm.invalidated,
        "invalidated_baseline": base.invalidated,
        "seconds": round(seconds, 1),
        "per_hour": rows,
    }
    if warm.prewarm is not None:
        out["deploy_prewarm"] = getattr(warm.prewarm, "detail", str(warm.prewarm))
    return out


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or not b else round(a / b, 4)
