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
SOURCE = (
    "the log after --from replayed in virtual time through the shipped planner, scheduler and "
    "pacing; exact cache; GPU time as the log gives it"
)


def write_plots(report: dict[str, Any], out: Path) -> list[Path]:
    return [gpu_per_hour(name, f, out) for name, f in report["regimes"].items()]


def gpu_per_hour(name: str, f: dict[str, Any], out: Path) -> Path:
    rows = f["per_hour"]
    x = [datetime.fromisoformat(r["hour"]) for r in rows]
    live = [r["live_gpu_s"] for r in rows]
    sends = [r["send_gpu_s"] for r in rows]
    base = [r["gpu_s_baseline"] for r in rows]
    fig, (top, low) = plt.subplots(2, 1, figsize=(11, 6.5), sharex=True, height_ratios=(3, 1.4))
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
    low.xaxis.set_major_formatter(DateFormatter("%a %d %H:00"))  # type: ignore[no-untyped-call]
    fig.legend(loc="outside right upper", fontsize=8)
    fig.text(0.01, 0.005, SOURCE, fontsize=7, color="dimgrey")
    fig.autofmt_xdate()
    path = out / f"warming_{name}.png"
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return path
