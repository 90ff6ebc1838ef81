"""The demo's plots: hit rate over time (with vs without warming), warm QPS, purge progress."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only; no display on servers and CI
import matplotlib.pyplot as plt
from matplotlib.figure import Figure

from stoker.demo.client import ServeStats
from stoker.demo.run import PassResult


def _hourly_hit_rate(s: ServeStats, hours: int, smooth_h: int = 3) -> list[float]:
    rates = []
    for h in range(hours):
        window = [s.hourly[x] for x in range(max(0, h - smooth_h + 1), h + 1) if x in s.hourly]
        n = sum(w.requests for w in window)
        rates.append(sum(w.exact + w.semantic for w in window) / n if n else float("nan"))
    return rates


def hit_rate(
    warm: PassResult, base: PassResult, hours: int, deploy_h: int | None, out: Path
) -> Path:
    fig, ax = plt.subplots(figsize=(10, 4))
    ax.plot(_hourly_hit_rate(warm.serve, hours), label="with warming")
    ax.plot(_hourly_hit_rate(base.serve, hours), label="without warming (baseline)")
    if deploy_h is not None:
        ax.axvline(deploy_h, color="grey", linestyle="--", label="model deploy")
    for inv in warm.invalidations:
        ax.axvline(inv["hour"], color="red", alpha=0.3, linestyle=":")
    ax.set_xlabel("hour of week 2")
    ax.set_ylabel("hit rate (3-hour rolling)")
    ax.set_ylim(0, 1)
    ax.legend(loc="lower right")
    ax.set_title("Cache hit rate over week 2 (dotted red: knowledge-base changes)")
    return _save(fig, out / "hit_rate.png")


def warm_qps(warm: PassResult, out: Path) -> Path:
    fig, ax = plt.subplots(figsize=(10, 3.5))
    ws = warm.warm_windows
    ax.bar([w["hour"] for w in ws], [w.get("achieved_qps", 0.0) for w in ws], label="achieved QPS")
    ax2 = ax.twinx()
    ax2.plot([w["hour"] for w in ws], [w.get("sent", 0) for w in ws], color="orange", label="sent")
    ax.set_xlabel("hour of week 2 (warm window)")
    ax.set_ylabel("warm QPS")
    ax2.set_ylabel("warm requests sent")
    ax.set_title("Shadow warming against the simulated GPU, per window")
    return _save(fig, out / "warm_qps.png")


def purge_progress(warm: PassResult, out: Path) -> Path:
    fig, ax = plt.subplots(figsize=(8, 3.5))
    d = warm.deploy
    pts = [(t, st) for t, st in warm.statuses if d and st.job_id == d.get("deploy_id")]
    if pts:
        t0 = d["started_at"]
        ax.step([t - t0 for t, _ in pts], [st.progress for _, st in pts], where="post")
        for t, st in pts:
            if st.state in ("ready", "done"):
                ax.annotate(st.state, (t - t0, st.progress))
    ax.set_xlabel("seconds since the deploy event")
    ax.set_ylabel("cutover progress")
    ax.set_ylim(0, 1.05)
    ax.set_title("Model-version cutover: pre-warm, ready, grace, retire, staggered purge")
    return _save(fig, out / "purge_progress.png")


def gpu_demand(regime: str, f: dict[str, Any], out: Path) -> Path:
    """GPU-seconds per hour with and without warming (warm sends in the hour they go out): the
    peak is the capacity a cluster must be provisioned for."""
    fig, ax = plt.subplots(figsize=(10, 3.5))
    per = f["gpu_s_per_hour"]
    first = f["hours"][0]
    xs = list(range(first, first + len(per["baseline"])))
    ax.plot(xs, per["with_warming"], label=f"with warming (peak {f['peak_gpu_s']:,.0f})")
    ax.plot(xs, per["baseline"], label=f"without (peak {f['peak_gpu_s_baseline']:,.0f})")
    ax.bar(xs, per["warm_sends"], color="orange", alpha=0.5, label="of it, warm sends")
    ax.set_xlabel("hour of week 2")
    ax.set_ylabel("GPU-seconds")
    ax.legend(loc="upper right")
    ax.set_title(f"GPU demand per hour, TTL {f['ttl_h']} h ({regime})")
    return _save(fig, out / f"gpu_demand_{regime}.png")


def _save(fig: Figure, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
