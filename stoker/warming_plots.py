"""The plots of `stoker analyze --warming`: per TTL, GPU-seconds per hour with warming (live
misses and warm sends stacked) against without, the peaks marked, and the hit rate per hour.

Legends sit outside the axes, so no line hides behind one; each figure says under its axes
what it rests on: the user's log, replayed against an exact cache priced from its own gpu_ms.
"""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only; no display on servers and CI
import matplotlib.pyplot as plt
from matplotlib.dates import DateFormatter

WARM, BASE, SENDS = "tab:blue", "black", "tab:orange"
DEPLOY: dict[str, Any] = {"color": "grey", "linestyle": "--", "linewidth": 1.2}
KB: dict[str, Any] = {"color": "tab:red", "linestyle": ":", "alpha": 0.7}
SOURCE = (
    "the log after --from replayed in virtual time through the shipped planner, scheduler and "
    "pacing; exact cache; GPU time as the log gives it"
)


def write_plots(report: dict[str, Any], out: Path) -> list[Path]:
    events = _events(report)
    return [gpu_per_hour(name, f, out, events) for name, f in report["regimes"].items()]


def _events(report: dict[str, Any]) -> list[tuple[datetime, str]]:
    """The deploy and the knowledge-base changes, as (time, label), for the plots' markers."""
    out = []
    if report.get("deploy_at"):
        out.append((datetime.fromisoformat(report["deploy_at"]), "deploy"))
    for at in sorted({c["at"] for c in report.get("kb_changes", [])}):
        out.append((datetime.fromisoformat(at), "KB change"))
    return out


def gpu_per_hour(
    name: str, f: dict[str, Any], out: Path, events: list[tuple[datetime, str]] | None = None
) -> Path:
    rows = f["per_hour"]
    x = [datetime.fromisoformat(r["hour"]) for r in rows]
    live = [r["live_gpu_s"] for r in rows]
    sends = [r["send_gpu_s"] for r in rows]
    base = [r["gpu_s_baseline"] for r in rows]
    fig, (top, low) = plt.subplots(
        2, 1, figsize=(12, 7), sharex=True, height_ratios=(3, 1.4), layout="constrained"
    )
    width = 1 / 24
    top.bar(x, live, width=width, color=WARM, alpha=0.55, label="with warming: live misses",
            align="edge")  # fmt: skip
    top.bar(x, sends, width=width, bottom=live, color=SENDS, alpha=0.85,
            label="with warming: warm sends (in the hour they went out)", align="edge")  # fmt: skip
    top.step(x, base, where="post", color=BASE, linewidth=1.0, label="without warming")
    if f["peak_hour"] is not None:
        top.axhline(f["peak_gpu_s"], color=WARM, linestyle="--", linewidth=1,
                    label=f"peak with warming: {f['peak_gpu_s']:,.0f} GPU-s")  # fmt: skip
        top.axhline(f["peak_gpu_s_baseline"], color=BASE, linestyle=":", linewidth=1,
                    label=f"peak without: {f['peak_gpu_s_baseline']:,.0f} GPU-s")  # fmt: skip
    top.set_ylabel("GPU-seconds per hour")
    ratio = f["peak_gpu_ratio"]
    eff = f["warm_efficiency"]
    top.set_title(
        f"{name}: peak {ratio:.2f}x, total {f['total_gpu_ratio']:.3f}x, "
        f"{f['warm_sends']:,} warm sends, {'-' if eff is None else f'{eff:.2f}'} hits added "
        "a send"
        if ratio is not None and f["total_gpu_ratio"] is not None
        else f"{name}: no GPU time in the replayed span"
    )
    hits = [r["hits"] / r["requests"] if r["requests"] else float("nan") for r in rows]
    hits_b = [r["hits_baseline"] / r["requests"] if r["requests"] else float("nan") for r in rows]
    low.plot(x, hits, color=WARM, label="hit rate with warming")
    low.plot(x, hits_b, color=BASE, linewidth=0.8, label="without")
    low.set_ylim(0, 1)
    low.set_ylabel("hit rate")
    for at, label in events or []:
        style = DEPLOY if label == "deploy" else KB
        for ax in (top, low):
            ax.axvline(at, **style)
        top.annotate(label, (at, 1.0), xycoords=("data", "axes fraction"), fontsize=7,
                     rotation=90, va="top", ha="right", color=style["color"])  # fmt: skip
    low.xaxis.set_major_formatter(DateFormatter("%a %d %H:00"))  # type: ignore[no-untyped-call]
    fig.legend(loc="outside lower center", ncols=3, fontsize=8)
    low.set_xlabel(SOURCE, fontsize=7, color="dimgrey")
    for label in low.get_xticklabels():
        label.set_rotation(20)
        label.set_horizontalalignment("right")
    path = out / f"warming_{name}.png"
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return path
