"""The live demo's plots: what the day's requests got hour by hour, the TTFT of the first
requests after the deploy with and without the prefix warm, and where the model's seconds went.

Legends sit outside the axes; every figure says under its axes that it comes from the real
model server (nothing in it is simulated).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only; no display on servers and CI
import matplotlib.pyplot as plt
from matplotlib.figure import Figure

from demo.live.report import MODEL, SOURCE_NAMES, WARMING

REAL = f"real model: {MODEL}, -t 1 on a 2-core box; time compressed (the hours are the log's)"
COLORS = {"exact": "tab:green", "semantic": "tab:olive", "miss": "tab:grey", "bypass": "0.8"}
COLD, WARM = "tab:red", "tab:blue"
DEPLOY: dict[str, Any] = {"color": "black", "linestyle": "--", "linewidth": 1.2}
KB: dict[str, Any] = {"color": "tab:purple", "linestyle": ":", "linewidth": 1.5}


def all_plots(report: dict[str, Any], out: Path) -> list[Path]:
    return [hit_rate(report, out), ttft(report, out), backend(report, out)]


def hit_rate(report: dict[str, Any], out: Path) -> Path:
    """Requests per hour by what they got, stacked; the KB change and the deploy marked."""
    hours = report["hit_rates"]["by_hour"]
    xs = [h["hour"] for h in hours]
    fig, ax = plt.subplots(figsize=(11, 4.2), layout="constrained")
    bottom = [0] * len(xs)
    for o, color in COLORS.items():
        ys = [h[o] for h in hours]
        ax.bar(xs, ys, bottom=bottom, color=color, width=0.8, label=o)
        bottom = [a + b for a, b in zip(bottom, ys, strict=True)]
    if report["kb_change"]:
        ax.axvline(report["kb_change"]["hour"] - 0.5, **KB, label="knowledge-base change")
    if report["deploy"]:
        ax.axvline(report["deploy"]["hour"] - 0.5, **DEPLOY, label="deploy (server restarted)")
    for h in hours:  # the hour's hit rate over its bar
        if h["requests"]:
            ax.annotate(f"{h['hit_rate']:.0%}", (h["hour"], h["requests"]), ha="center",
                        va="bottom", fontsize=7, xytext=(0, 2), textcoords="offset points")  # fmt: skip
    ax.set_xlim(-0.6, 23.6)
    ax.set_ylim(0, max([*bottom, 1]) * 1.15)
    ax.set_xlabel("hour of the day")
    ax.set_ylabel("requests")
    day = report["hit_rates"]["day"]
    ax.set_title(
        f"{report['day']['date']}: {day['requests']} requests, {day['hit_rate']:.1%} hits "
        f"(exact {day['exact_share']:.1%}, semantic {day['semantic_share']:.1%}); "
        "the share of hits over each hour",
        loc="left", fontsize=10,
    )  # fmt: skip
    fig.legend(loc="outside right upper")
    return _save(fig, out / "hit_rate_live.png")


def ttft(report: dict[str, Any], out: Path) -> Path:
    """Each probe's time to first token on a fresh server, cold and after the prefix warm."""
    t = report["ttft_after_deploy"]
    fig, ax = plt.subplots(figsize=(11, 4.2), layout="constrained")
    for key, color, label, dx in (
        ("cold", COLD, "fresh server, prompt cache empty", -0.15),
        ("prefix_warmed", WARM, "fresh server after the prefix warm", 0.15),
    ):
        arm = t[key]
        xs = [i + dx for i, v in enumerate(arm["ms"]) if v is not None]
        ys = [v / 1000 for v in arm["ms"] if v is not None]
        ax.scatter(xs, ys, color=color, label=label, zorder=3)
        for q, style in (("p50", "-"), ("p99", ":")):
            v = arm[f"{q}_ms"]
            if v is not None:
                ax.axhline(v / 1000, color=color, linestyle=style, linewidth=1,
                           label=f"{q} {v / 1000:.2f} s ({'cold' if key == 'cold' else 'warmed'})")  # fmt: skip
    tenants = t["cold"]["tenants"]
    ax.set_xticks(range(len(tenants)), [f"{i + 1}\n{x}" for i, x in enumerate(tenants)], fontsize=8)
    ax.set_yscale("log")
    ax.set_xlabel("the first requests after the deploy, in order (and their tenant)")
    ax.set_ylabel("time to first token (s, log)")
    ax.set_title(
        f"TTFT after the deploy's restart: p50 ratio {t['p50_ratio']}, p99 ratio {t['p99_ratio']} "
        f"(prefix-warmed / cold); the warm itself took {t['prefix_warm'].get('seconds', 0)} s",
        loc="left", fontsize=10,
    )  # fmt: skip
    fig.legend(loc="outside right upper", fontsize=8)
    return _save(fig, out / "ttft_after_deploy.png")


def backend(report: dict[str, Any], out: Path) -> Path:
    """The model's seconds (its own timings) by who asked."""
    b = report["backend_seconds"]
    names = list(SOURCE_NAMES)
    secs = [b["by_source_s"][n] for n in names]
    colors = [
        "tab:grey" if n == "live" else "tab:orange" if n in WARMING else "0.75" for n in names
    ]
    fig, ax = plt.subplots(figsize=(11, 3.6), layout="constrained")
    ys = range(len(names))
    ax.barh(ys, secs, color=colors)
    for y, (n, s) in enumerate(zip(names, secs, strict=True)):
        ax.annotate(f"{s:.1f} s, {b['calls'][n]} call{'s' * (b['calls'][n] != 1)}", (s, y), va="center", fontsize=8,
                    xytext=(4, 0), textcoords="offset points")  # fmt: skip
    ax.set_yticks(list(ys), [SOURCE_NAMES[n] for n in names])
    ax.invert_yaxis()
    ax.set_xlim(0, max([*secs, 1.0]) * 1.3)
    ax.set_xlabel("model seconds (prompt_ms + predicted_ms)")
    ax.set_title(
        f"Where the model's time went: warming {b['warming_share']:.0%} of warming + live "
        f"misses; the request log's gpu_ms of the live misses: {b['request_log_gpu_s']} s",
        loc="left", fontsize=10,
    )  # fmt: skip
    return _save(fig, out / "backend_seconds.png")


def _save(fig: Figure, path: Path) -> Path:
    fig.supxlabel(REAL, fontsize=8, color="grey")
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
