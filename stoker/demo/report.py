"""The demo's report: figures (report.json), a terminal table and plots (*.png)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import orjson
from rich.console import Console
from rich.table import Table

from stoker.demo.client import ServeStats
from stoker.demo.run import PassResult


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


def build_report(warm: PassResult, base: PassResult, fast: bool) -> dict[str, Any]:
    warm_gpu_s = sum(w.get("gpu_seconds", 0.0) for w in warm.warm_windows)
    w, b = figures(warm.serve, warm_gpu_s), figures(base.serve)
    report: dict[str, Any] = {
        "mode": "fast" if fast else "default",
        **{k: w[k] for k in ("hit_rate_exact", "hit_rate_semantic", "hit_rate_total")},
        "hit_rate_total_baseline": b["hit_rate_total"],
        "hit_rate_exact_baseline": b["hit_rate_exact"],
        "hit_rate_semantic_baseline": b["hit_rate_semantic"],
        "gpu_seconds_saved_pct": w["gpu_seconds_saved_pct"],
        "gpu_seconds_saved_pct_baseline": b["gpu_seconds_saved_pct"],
        "latency_p50_ms": w["latency_p50_ms"],
        "latency_p99_ms": w["latency_p99_ms"],
        "warm_requests": sum(x.get("sent", 0) for x in warm.warm_windows),
        "warm_gpu_seconds": round(warm_gpu_s, 1),
        "stale_hits": w["stale_hits"] + b["stale_hits"],
        "cross_tenant_hits": w["cross_tenant_hits"] + b["cross_tenant_hits"],
        "false_semantic_hits": w["false_semantic_hits"],
        "false_semantic_hits_baseline": b["false_semantic_hits"],
        "with_warming": w,
        "baseline": b,
        "deploy": warm.deploy,
        "deploy_baseline": base.deploy,
        "kb_changes": warm.invalidations,
        "seconds": {"with_warming": round(warm.seconds, 1), "baseline": round(base.seconds, 1)},
    }
    return report


def write(report: dict[str, Any], out: Path) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    path = out / "report.json"
    path.write_bytes(orjson.dumps(report, option=orjson.OPT_INDENT_2 | orjson.OPT_NON_STR_KEYS))
    return path


ROWS = (
    ("hit rate, exact", "hit_rate_exact", "{:.1%}"),
    ("hit rate, semantic", "hit_rate_semantic", "{:.1%}"),
    ("hit rate, total", "hit_rate_total", "{:.1%}"),
    ("GPU-seconds saved (net of warming)", "gpu_seconds_saved_pct", "{:.1f}%"),
    ("GPU-seconds on live misses", "gpu_seconds_live", "{:,.1f}"),
    ("latency p50 (ms)", "latency_p50_ms", "{:.2f}"),
    ("latency p99 (ms)", "latency_p99_ms", "{:.0f}"),
    ("stale hits", "stale_hits", "{}"),
    ("cross-tenant hits", "cross_tenant_hits", "{}"),
    ("false semantic hits", "false_semantic_hits", "{}"),
    ("requests", "requests", "{:,}"),
)


def print_table(report: dict[str, Any], console: Console) -> None:
    t = Table(title=f"stoker demo ({report['mode']}): week 2 served with and without warming")
    t.add_column("figure")
    t.add_column("with warming", justify="right")
    t.add_column("without (baseline)", justify="right")
    for label, key, fmt in ROWS:
        t.add_row(
            label, fmt.format(report["with_warming"][key]), fmt.format(report["baseline"][key])
        )
    console.print(t)
    console.print(
        "Warming spends GPU ahead of the traffic, at a capped QPS, to take first misses out of "
        "the busy hours: it lowers live GPU load and latency, and costs about one miss per "
        "entry it warms, so net GPU saved can be lower than without it."
    )
    d = report.get("deploy") or {}
    console.print(
        f"warm requests: {report['warm_requests']:,} ({report['warm_gpu_seconds']} GPU-s); "
        f"deploy {d.get('from')} -> {d.get('to')}: ready after {d.get('ready_after_s')} s "
        f"({d.get('ready_detail', '')}), done after {d.get('done_after_s')} s, "
        f"old-version keys left: {d.get('old_version_keys_left')}; "
        f"KB changes: {len(report['kb_changes'])} docs"
    )
