"""The demo's report: figures (report.json), a terminal table and plots (*.png)."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import orjson
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from demo.client import ServeStats
from demo.foresight import min_peak
from demo.run import PassResult
from demo.scenario import Scenario


def figures(s: ServeStats, warm_gpu_s: float = 0.0) -> dict[str, Any]:
    n = max(s.requests, 1)
    lat = np.asarray(s.latency_ms or [0.0])
    saved_s = s.gpu_ms_saved / 1000.0
    total_s = max(s.gpu_ms_total / 1000.0, 1e-9)
    return {
        "requests": s.requests,
        "outcomes": dict(s.outcomes),
        "hit_rate_exact": round(s.outcomes["exact"] / n, 4),
        "hit_rate_semantic": round(s.outcomes["semantic"] / n, 4),
        "hit_rate_total": round((s.outcomes["exact"] + s.outcomes["semantic"]) / n, 4),
        "cacheable_share": round(s.cacheable / n, 4),
        "gpu_seconds_total": round(total_s, 1),
        "gpu_seconds_saved": round(saved_s, 1),
        # what live misses cost while traffic ran: warming moves GPU work out of these hours
        "gpu_seconds_live": round(total_s - saved_s, 1),
        # net of what warming spent: warming that costs more GPU than it saves shows as a loss
        "gpu_seconds_saved_pct": round(100.0 * (saved_s - warm_gpu_s) / total_s, 2),
        "latency_p50_ms": round(float(np.percentile(lat, 50)), 3),
        "latency_p99_ms": round(float(np.percentile(lat, 99)), 3),
        "stale_hits": s.stale_hits,
        "cross_tenant_hits": s.cross_tenant_hits,
        "false_semantic_hits": s.false_semantic_hits,
        "coalesced": s.coalesced,
        "errors": s.errors,
    }


def build_report(regimes: dict[str, dict[str, Any]], primary: str, mode: str) -> dict[str, Any]:
    """report.json: each regime's figures under `regimes`, and at the top level the primary
    regime's (named by `regime`), for readers of the single-regime report this one extends."""
    f = regimes[primary]
    w, b = f["with_warming"], f["baseline"]
    return {
        "mode": mode,
        # every figure below rests on the simulated GPU backend (stoker sim-backend), its
        # answers priced at what the log's requests cost a real GPU
        "backend": "simulated",
        "regime": primary,
        **{k: w[k] for k in ("hit_rate_exact", "hit_rate_semantic", "hit_rate_total")},
        "hit_rate_total_baseline": b["hit_rate_total"],
        "hit_rate_exact_baseline": b["hit_rate_exact"],
        "hit_rate_semantic_baseline": b["hit_rate_semantic"],
        # net of every warm send of the regime, the deploy's pre-warm included (as the verdict)
        "gpu_seconds_saved_pct": w["gpu_seconds_saved_pct"],
        "gpu_seconds_saved_pct_baseline": b["gpu_seconds_saved_pct"],
        "latency_p50_ms": w["latency_p50_ms"],
        "latency_p99_ms": w["latency_p99_ms"],
        "warm_requests": f["warm_requests"],
        "warm_gpu_seconds": f["warm_gpu_s"],
        "stale_hits": sum(r["with_warming"]["stale_hits"] + r["baseline"]["stale_hits"]
                          for r in regimes.values()),
        "cross_tenant_hits": sum(r["with_warming"]["cross_tenant_hits"]
                                 + r["baseline"]["cross_tenant_hits"] for r in regimes.values()),
        "false_semantic_hits": w["false_semantic_hits"],
        "false_semantic_hits_baseline": b["false_semantic_hits"],
        "with_warming": w,
        "baseline": b,
        "deploy": f["deploy"],
        "deploy_baseline": f["deploy_baseline"],
        "kb_changes": f["kb_changes"],
        "seconds": {name: r["seconds"] for name, r in regimes.items()},
        "headlines": {name: r["headline"] for name, r in regimes.items()},
        "regimes": regimes,
    }  # fmt: skip


def write(report: dict[str, Any], out: Path) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    path = out / "report.json"
    path.write_bytes(orjson.dumps(report, option=orjson.OPT_INDENT_2 | orjson.OPT_NON_STR_KEYS))
    return path


# (label, key, format, where): "figures" reads the pass's figures(), "regime" the regime's own
ROWS = (
    ("hit rate, total", "hit_rate_total", "{:.1%}", "figures"),
    ("  of it exact", "hit_rate_exact", "{:.1%}", "figures"),
    ("  of it semantic", "hit_rate_semantic", "{:.1%}", "figures"),
    ("net GPU saved (warm sends paid)", "gpu_seconds_saved_pct", "{:.1f}%", "figures"),
    ("peak-hour GPU-s (sends included)", "peak_gpu_s", "{:,.1f}", "regime"),
    ("total GPU-s (sends included)", "total_gpu_s", "{:,.1f}", "regime"),
    ("  of it warm sends (pre-warm too)", "warm_gpu_s", "{:,.1f}", "regime"),
    ("latency p50 (ms)", "latency_p50_ms", "{:.2f}", "figures"),
    ("latency p99 (ms)", "latency_p99_ms", "{:.0f}", "figures"),
    ("stale hits", "stale_hits", "{}", "figures"),
    ("cross-tenant hits", "cross_tenant_hits", "{}", "figures"),
    ("false semantic hits", "false_semantic_hits", "{}", "figures"),
    ("requests", "requests", "{:,}", "figures"),
)  # fmt: skip


def table_rows(f: dict[str, Any]) -> list[tuple[str, str, str]]:
    """One regime's table, (figure, with warming, without), every cell from `f` itself."""
    rows = []
    for label, key, fmt, where in ROWS:
        if where == "figures":
            w, b = f["with_warming"][key], f["baseline"][key]
        elif key == "warm_gpu_s":
            w, b = f[key], 0.0
        else:
            w, b = f[key], f[f"{key}_baseline"]
        rows.append((label, fmt.format(w), fmt.format(b)))
    return rows


def regime_title(f: dict[str, Any]) -> str:
    """The regime as a reader names it: its TTL and the hours of week 2 it served."""
    ttl = "1 day" if f["ttl_h"] == 24 else f"{f['ttl_h']} hours"
    first, stop = f["hours"]
    return f"TTL {ttl}, week-2 hours {first}-{stop - 1}"


def print_report(report: dict[str, Any], console: Console) -> None:
    """Per regime: its headline, its table (named by the regime) and its verdict."""
    for name, f in report["regimes"].items():
        console.print()
        # one line each however long (soft_wrap), so a log can be searched for them
        console.print(f"[bold]{escape(f['headline'])}[/bold]", soft_wrap=True)
        t = Table(title=f"{name}: {regime_title(f)}, {report['mode']} run, simulated backend")
        t.add_column("figure")
        t.add_column("with warming", justify="right")
        t.add_column("without (baseline)", justify="right")
        for row in table_rows(f):
            t.add_row(*row)
        console.print(t)
        console.print(f"verdict: {f['verdict']}", highlight=False, soft_wrap=True, markup=False)
        console.print(_deploy_line(f), highlight=False, soft_wrap=True, markup=False)
    console.print(
        "Warming spends GPU ahead of the traffic, at a capped QPS, to take first misses out of "
        "the busy hours: it lowers live GPU load and latency, and costs about one miss per "
        "entry it warms, so net GPU saved can be lower than without it."
    )


def _deploy_line(f: dict[str, Any]) -> str:
    d = f.get("deploy") or {}
    if not d:
        return f"{f['warm_requests']:,} warm requests ({f['warm_gpu_s']} GPU-s); no deploy"
    counts = d.get("done_counts", {})
    return (
        f"{f['warm_requests']:,} warm requests ({f['warm_gpu_s']} GPU-s); deploy "
        f"{d.get('from')} -> {d.get('to')} at hour {d.get('hour')}: READY after "
        f"{d.get('ready_after_s')} s, DONE after {d.get('done_after_s')} s, purged "
        f"{counts.get('deleted', 0):,} keys in {counts.get('batches', 0)} batches, "
        f"old-version keys left: {d.get('old_version_keys_left')}; "
        f"KB changes: {len(f['kb_changes'])} docs"
    )


# -- regimes: where warming pays --

BUSIEST_SHARE = 0.1  # "the busiest hours": the tenth of the served hours with most requests
POST_DEPLOY_H = 6


def hourly_gpu(warm: PassResult, base: PassResult, hours: range) -> dict[str, list[float]]:
    """GPU-seconds per served hour: live misses, plus (with warming) the warm sends, each in the
    hour before the window it prepares (they go out in the 30 minutes before it): the
    scheduler's and the deploy's pre-warm apart, and summed in `warm_sends`."""
    scheduled, prewarm = [0.0] * len(hours), [0.0] * len(hours)

    def add(into: list[float], hour: int, gpu_s: float) -> None:
        i = min(max(hour - 1 - hours.start, 0), len(hours) - 1)
        into[i] += gpu_s

    for w in warm.warm_windows:
        add(scheduled, w["hour"], w.get("gpu_seconds", 0.0))
    deploy_h = warm.deploy.get("hour") if warm.deploy else None
    for p in warm.prewarms:
        add(prewarm, deploy_h if deploy_h is not None else hours.start, p.sent_miss_gpu_s)
    for lead in warm.lead_warms:  # sent ahead of the deploy, each in the hour it went out in
        add(prewarm, lead["hour"], lead.get("gpu_seconds", 0.0))
    sends = [a + b for a, b in zip(scheduled, prewarm, strict=True)]

    def live(s: ServeStats, h: int) -> float:
        return s.hourly[h].gpu_ms_live / 1000.0 if h in s.hourly else 0.0

    return {
        "with_warming": [live(warm.serve, h) + sends[i] for i, h in enumerate(hours)],
        "warm_sends": sends,
        "scheduled_sends": scheduled,
        "prewarm_sends": prewarm,
        "baseline": [live(base.serve, h) for h in hours],
    }


def foresight_bound(base: ServeStats, sc: Scenario) -> dict[str, Any]:
    """The lowest peak-hour ratio any warming could reach on this run's traffic
    (demo/foresight.py): the baseline's misses on requests logged earlier moved up to
    `lead_h` hours ahead with perfect foresight, the other misses left where they are. A window's
    sends go out in the hour before it and its entries live for the TTL, so lead_h is the
    horizon or the TTL, whichever is shorter. `_frequent`: only the misses on requests logged
    about daily (client.FREQUENT) move, the ones a forecast can call; a request logged once or
    twice a week is asked in a given 3-hour window by chance, so a warm of it mostly goes to
    waste."""
    rows = [base.hourly.get(h) for h in sc.served_hours]
    live = [r.gpu_ms_live / 1000.0 if r else 0.0 for r in rows]
    peak, lead = max(live, default=0.0), min(sc.warm_horizon_h, sc.ttl_h)
    out: dict[str, Any] = {"peak_bound_lead_h": lead}
    for suffix, field in (("", "gpu_ms_live_replayable"), ("_frequent", "gpu_ms_live_frequent")):
        movable = [getattr(r, field) / 1000.0 if r else 0.0 for r in rows]
        fixed = [a - b for a, b in zip(live, movable, strict=True)]
        low = min_peak(fixed, movable, lead)
        out[f"peak_gpu_ratio_bound{suffix}"] = round(low / peak, 4) if peak else None
        # of the baseline's live miss GPU, the share that may move
        out[f"{'replayable' if not suffix else 'frequent'}_miss_share"] = (
            round(sum(movable) / sum(live), 4) if sum(live) else None
        )
    return out


def peak_capture(peak_ratio: float | None, bound: float | None) -> float | None:
    """The share of the reachable peak reduction warming took: (1 - peak_gpu_ratio) over
    (1 - the floor a forecast could reach, peak_gpu_ratio_bound_frequent). Negative when warming
    raised the peak. None when it is undefined: no peak (no baseline GPU, so no ratio), or no
    reachable reduction (the floor at or above the baseline's peak)."""
    if peak_ratio is None or bound is None or bound >= 1.0 - 1e-9:
        return None
    return round((1.0 - peak_ratio) / (1.0 - bound), 4)


def _hit_rate(s: ServeStats, hours: Iterable[int]) -> float:
    rows = [s.hourly[h] for h in hours if h in s.hourly]
    n = sum(r.requests for r in rows)
    return sum(r.exact + r.semantic for r in rows) / n if n else 0.0


def _busiest_latency(s: ServeStats, hours: range) -> dict[str, float]:
    by_load = sorted((h for h in hours if h in s.hourly), key=lambda h: -s.hourly[h].requests)
    top = by_load[: max(3, int(len(by_load) * BUSIEST_SHARE))]
    lat = np.asarray([x for h in top for x in s.hourly[h].latency_ms] or [0.0])
    return {
        "p95_ms": round(float(np.percentile(lat, 95)), 1),
        "p99_ms": round(float(np.percentile(lat, 99)), 1),
        "hours": len(top),
    }


def regime_figures(warm: PassResult, base: PassResult, sc: Scenario) -> dict[str, Any]:
    """One regime's answer to "did warming pay": peak-hour and total GPU demand with against
    without warming, warm efficiency (extra hits per warm request), the hit rate after the
    deploy against before it, net GPU saved, latency in the busiest hours."""
    hours = sc.served_hours
    gpu = hourly_gpu(warm, base, hours)
    peak_w, peak_b = max(gpu["with_warming"]), max(gpu["baseline"])
    total_w, total_b = sum(gpu["with_warming"]), sum(gpu["baseline"])
    sends = sum(x.get("sent", 0) for x in warm.warm_windows) + sum(p.sent for p in warm.prewarms)
    sends += sum(x.get("sent", 0) for x in warm.lead_warms)
    hits = {k: s.outcomes["exact"] + s.outcomes["semantic"] for k, s in
            (("w", warm.serve), ("b", base.serve))}  # fmt: skip
    warm_gpu_s = sum(gpu["warm_sends"])
    w, b = figures(warm.serve, warm_gpu_s), figures(base.serve)
    out: dict[str, Any] = {
        "ttl_h": sc.ttl_h,
        "hours": [hours.start, hours.stop],
        "warm_every_h": sc.warm_every_h,
        "warm_horizon_h": sc.warm_horizon_h,
        "peak_gpu_s": round(peak_w, 1),
        "peak_gpu_s_baseline": round(peak_b, 1),
        "peak_gpu_ratio": round(peak_w / peak_b, 4) if peak_b else None,
        **foresight_bound(base.serve, sc),
        "total_gpu_s": round(total_w, 1),
        "total_gpu_s_baseline": round(total_b, 1),
        "total_gpu_ratio": round(total_w / total_b, 4) if total_b else None,
        "warm_requests": sends,
        # warms held to the send hour's headroom (demo/headroom.py): the share of the forecast
        # peak they may fill up to, and the deploy's pre-warm sent ahead, hour by hour
        "headroom_share": sc.headroom_share,
        "deploy_lead_h": sc.deploy_lead_h,
        "lead_warms": warm.lead_warms,
        "warm_gpu_s": round(warm_gpu_s, 1),
        "extra_hits": hits["w"] - hits["b"],
        "warm_efficiency": round((hits["w"] - hits["b"]) / sends, 3) if sends else None,
        "hit_rate": w["hit_rate_total"],
        "hit_rate_baseline": b["hit_rate_total"],
        "net_saved_pct": w["gpu_seconds_saved_pct"],
        "net_saved_pct_baseline": b["gpu_seconds_saved_pct"],
        "net_saved_delta_points": round(w["gpu_seconds_saved_pct"] - b["gpu_seconds_saved_pct"], 2),
        # the plans' own forecast of what their sends save (net of their cost), beside what
        # the run shows: the baseline's live GPU minus the warming run's, minus the sends
        "expected_saving_gpu_s": round(
            sum(x.get("expected_gpu_s_saved", 0.0) for x in warm.warm_windows), 1
        ),
        "realised_saving_gpu_s": round(total_b - total_w, 1),
        # the same in misses: what the scheduler's sends were expected to prevent (the deploy
        # pre-warm, planned by hits, not counted), beside the extra hits it got
        "expected_prevented_misses": round(
            sum(x.get("expected_prevented", 0.0) for x in warm.warm_windows), 1
        ),
        "scheduled_warm_requests": sum(x.get("sent", 0) for x in warm.warm_windows),
        # planned sends left out when sent: the backend's answers showed a load at which they
        # no longer paid (priced again at send time, warmers/shadow.py)
        "scheduled_warms_priced_out": sum(x.get("priced_out", 0) for x in warm.warm_windows),
        # ... and what a gateway's log shows: the landed warms that then served a hit (within
        # their TTL), beside the misses those landed warms were expected to prevent
        **_warms_hit(warm, sc),
        "busiest_hours_latency": _busiest_latency(warm.serve, hours),
        "busiest_hours_latency_baseline": _busiest_latency(base.serve, hours),
        "expired_entries": sum(warm.expired.values()),
        "expired_entries_baseline": sum(base.expired.values()),
        "gpu_s_per_hour": {k: [round(x, 2) for x in v] for k, v in gpu.items()},
        # the whole table of the regime, from the same passes and sends as the verdict
        "with_warming": w,
        "baseline": b,
        "deploy": warm.deploy,
        "deploy_baseline": base.deploy,
        "kb_changes": warm.invalidations,
        "seconds": {"with_warming": round(warm.seconds, 1), "baseline": round(base.seconds, 1)},
    }
    out["peak_capture"] = peak_capture(
        out["peak_gpu_ratio"], out.get("peak_gpu_ratio_bound_frequent")
    )
    d = sc.deploy_at_h
    if d in hours:
        before = range(max(hours.start, d - POST_DEPLOY_H), d)
        after = range(d, min(hours.stop, d + POST_DEPLOY_H))
        for key, s in (("", warm.serve), ("_baseline", base.serve)):
            hb, ha = _hit_rate(s, before), _hit_rate(s, after)
            out[f"hit_rate_before_deploy{key}"] = round(hb, 4)
            out[f"hit_rate_after_deploy{key}"] = round(ha, 4)
            out[f"post_deploy_gap_points{key}"] = round(100 * (hb - ha), 2)
    out["paid"] = paid(out)
    out["headline"] = headline(sc.regime, out)
    out["verdict"] = regime_verdict(sc.regime, out)
    return out


def _warms_hit(warm: PassResult, sc: Scenario) -> dict[str, Any]:
    """Of the scheduled warms that landed, how many served a hit before they expired, against
    their summed chance of being asked (p_asked): the forecast's calibration, read from what
    the gateway says served each hit (x-stoker-key), no label read."""
    landed = expected = served = 0.0
    for x in warm.warm_windows:
        start = x["hour"]
        for key, p in x.get("warmed", {}).items():
            landed += 1
            expected += p
            served += any(start <= h < start + sc.ttl_h for h in warm.serve.hit_hours.get(key, ()))
    return {
        # sends whose answer did not land: refused as stale (a deploy retired the namespace,
        # a KB change moved a document's generation while it computed) or failed
        "warm_refused_stale": sum(x.get("refused_stale", 0) for x in warm.warm_windows),
        "warm_failed": sum(x.get("failed", 0) for x in warm.warm_windows),
        "landed_warms": int(landed),
        "landed_warms_expected_asked": round(expected, 1),
        "landed_warms_hit": int(served),
    }


# Warming pays in a regime when it saves net GPU, or cuts the peak hour's demand (what a cluster
# is provisioned for) by 5% or more at no more than 5% extra total GPU.
PEAK_PAYS, TOTAL_ALLOWED = 0.95, 1.05


def paid(f: dict[str, Any]) -> bool:
    """Did warming pay in this regime: the one rule the headline and the verdict both read."""
    peak, total = f.get("peak_gpu_ratio") or 1.0, f.get("total_gpu_ratio") or 1.0
    return bool(f["net_saved_delta_points"] >= 0 or (peak <= PEAK_PAYS and total <= TOTAL_ALLOWED))


def headline(name: str, f: dict[str, Any]) -> str:
    """The regime's answer in one sentence, with the figures its verdict rests on."""
    w, b = f["with_warming"]["gpu_seconds_saved_pct"], f["baseline"]["gpu_seconds_saved_pct"]
    peak, total = f.get("peak_gpu_ratio") or 1.0, f.get("total_gpu_ratio") or 1.0
    net = f"net GPU saved {w:.1f}% with warming against {b:.1f}% without"
    if f["net_saved_delta_points"] >= 0:
        why = f"{net} ({f['net_saved_delta_points']:+.1f} points)"
    elif paid(f):
        why = f"the peak hour at {peak:.2f}x and total GPU at {total:.2f}x of no warming, though {net}"
    else:
        why = (
            f"{net}, and the peak hour at {peak:.2f}x and total GPU at {total:.2f}x of no "
            f"warming (paying needs a net saving, or a peak <= {PEAK_PAYS}x at <= "
            f"{TOTAL_ALLOWED}x total)"
        )
    verb = "paid" if paid(f) else "did not pay"
    return f"{name} ({regime_title(f)}): warming {verb}: {why}"


def regime_verdict(name: str, f: dict[str, Any]) -> str:
    """One line: did warming pay in this regime (paid()), with its figures."""
    net = f["net_saved_delta_points"]
    peak, total = f.get("peak_gpu_ratio") or 1.0, f.get("total_gpu_ratio") or 1.0
    eff = f["warm_efficiency"]
    eff_s = "no warm requests" if eff is None else f"{eff:.2f} extra hits per warm request"
    bound = f.get("peak_gpu_ratio_bound")
    bound_s = "" if bound is None else f" (no warming could go below {bound:.2f}x"
    capture = f.get("peak_capture")
    if bound is not None:
        bound_s += ")" if capture is None else f"; it took {capture:.0%} of what a forecast could)"
    return (
        f"{name}: warming {'paid' if paid(f) else 'did not pay'}: peak-hour GPU {peak:.2f}x"
        f"{bound_s}, total GPU {total:.2f}x of no warming, net GPU saved {net:+.1f} points, "
        f"{eff_s}"
    )
