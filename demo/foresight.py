"""The lowest peak-hour GPU demand any warming could reach on a run's traffic: a bound, not a
plan. It tells a goal the traffic cannot meet from a planner that falls short of it.

A warm cannot make GPU work vanish: it moves a miss's prefill and decode to the hour the warm
is sent, at the same GPU cost (the report prices a send at the miss cost of its query). What a
warm can move is a miss on a request that was logged before (a warm replays a logged request;
a question never asked before cannot be warmed), and it moves it at most `lead_h` hours ahead
(a window's sends go out in the hour before it, and its entries live for the TTL).

Granting perfect foresight (every replayable miss warmed, no warm wasted, no extra refresh),
the lowest peak is a scheduling problem: work of hour h may run in any hour h - lead_h .. h,
in any fraction. Earliest-deadline-first over the hours is optimal for such fluid work, so
`min_peak` bisects on the peak and checks each candidate with it.
"""

from __future__ import annotations

from collections.abc import Sequence

_ROUNDS = 60  # bisection steps: the peak to within 2^-60 of its range


def fits(fixed: Sequence[float], movable: Sequence[float], peak: float, lead_h: int) -> bool:
    """Whether every hour stays at or under `peak`: fixed work where it is, movable work of hour
    h run somewhere in hours h - lead_h .. h (earliest deadline first)."""
    if len(fixed) != len(movable):
        raise ValueError("fixed and movable must cover the same hours")
    if lead_h < 0:
        raise ValueError(f"lead_h must be >= 0, got {lead_h}")
    left = [float(x) for x in movable]
    n = len(left)
    for t in range(n):
        room = peak - fixed[t]
        if room < 0:
            return False
        for h in range(t, min(n, t + lead_h + 1)):  # released by now, due soonest first
            take = min(room, left[h])
            left[h] -= take
            room -= take
            if room <= 0:
                break
        if left[t] > 1e-9 * max(1.0, peak):
            return False  # hour t's own work is due and did not fit
    return True


def min_peak(fixed: Sequence[float], movable: Sequence[float], lead_h: int) -> float:
    """The lowest hourly peak reachable by moving `movable` work up to lead_h hours earlier."""
    if not fixed:
        return 0.0
    lo = max(fixed)
    hi = max(f + m for f, m in zip(fixed, movable, strict=True))
    for _ in range(_ROUNDS):
        mid = (lo + hi) / 2
        if fits(fixed, movable, mid, lead_h):
            hi = mid
        else:
            lo = mid
    return hi
