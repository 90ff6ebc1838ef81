"""The demo's plots: hit rate over week 2 per regime, GPU demand per hour per regime (live
misses and warm sends apart, the peaks marked), the warm sends per window, and the deploy's
cutover with its staggered purge.

Legends sit outside the axes (a figure legend placed "outside"), so no line or bar hides
behind one, and every figure names its regime and says under its axes that it rests on the
simulated GPU backend.
"""

from __future__ import annotations

import textwrap
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only; no display on servers and CI
import matplotlib.pyplot as plt
from matplotlib.artist import Artist
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Rectangle
from matplotlib.ticker import PercentFormatter

from demo.client import ServeStats
from demo.report import regime_title
from demo.run import PassResult
from demo.scenario import Scenario

Run = tuple[Scenario, PassResult, PassResult]  # a regime, its pass with warming, its baseline

SIMULATED = (
    "simulated GPU backend (stoker sim-backend), time compressed: an hour of week 2 takes a "
    "few wall seconds"
)
WARM, BASE, SENDS, PREWARM = "tab:blue", "black", "tab:orange", "tab:purple"
BAD, QPS = "tab:red", "tab:cyan"
DEPLOY: dict[str, Any] = {"color": "grey", "linestyle": "--", "linewidth": 1.2}
KB: dict[str, Any] = {"color": "tab:red", "linestyle": ":", "alpha": 0.6}


def all_plots(runs: Sequence[Run], figures: dict[str, dict[str, Any]], out: Path) -> list[Path]:
    """Every plot of the demo; the warm sends and the cutover are the first regime's."""
    sc, warm, _ = runs[0]
    return [
        hit_rate(runs, figures, out),
        warm_qps(sc, warm, figures[sc.regime], out),
        purge_progress(sc, warm, figures[sc.regime], out),
        *(gpu_demand(rg.regime, figures[rg.regime], out) for rg, _, _ in runs),
    ]


def _hourly_hit_rate(s: ServeStats, hours: int, smooth_h: int = 3) -> list[float]:
    rates = []
    for h in range(hours):
        if h not in s.hourly:  # an hour the pass did not serve has no rate, rolling or not
            rates.append(float("nan"))
            continue
        window = [s.hourly[x] for x in range(max(0, h - smooth_h + 1), h + 1) if x in s.hourly]
        n = sum(w.requests for w in window)
        rates.append(sum(w.exact + w.semantic for w in window) / n if n else float("nan"))
    return rates


def hit_rate(runs: Sequence[Run], figures: dict[str, dict[str, Any]], out: Path) -> Path:
    """One panel per regime, on week 2's hours; hours a regime did not serve are shaded."""
    hours = max(rg.week2_hours for rg, _, _ in runs)
    fig, axes = plt.subplots(
        len(runs), 1, figsize=(11, 1.0 + 2.6 * len(runs)), sharex=True, squeeze=False,
        layout="constrained",
    )  # fmt: skip
    top = 0.05
    for ax, (rg, warm, base) in zip(axes[:, 0], runs, strict=True):
        f = figures[rg.regime]
        w, b = _hourly_hit_rate(warm.serve, hours), _hourly_hit_rate(base.serve, hours)
        ax.plot(range(hours), w, color=WARM, label="with warming")
        ax.plot(range(hours), b, color=BASE, label="without warming (baseline)")
        top = max([top, *(x for x in w + b if x == x)])
        _events(ax, warm)
        if rg.first_h > 0:
            ax.axvspan(-0.5, rg.first_h - 0.5, color="0.92", label="not served in this regime")
        ax.set_ylabel("hit rate\n(3-hour rolling)")
        ax.yaxis.set_major_formatter(PercentFormatter(1.0, decimals=0))
        ax.set_title(
            f"{rg.regime} ({regime_title(f)}): {f['hit_rate']:.1%} of requests hit with "
            f"warming, {f['hit_rate_baseline']:.1%} without",
            loc="left", fontsize=10,
        )  # fmt: skip
    for ax in axes[:, 0]:
        ax.set_ylim(0, min(1.0, top * 1.15))
        ax.set_xlim(-0.5, hours - 0.5)
    axes[-1, 0].set_xlabel("hour of week 2")
    handles: list[Artist] = [
        Line2D([], [], color=WARM, label="with warming"),
        Line2D([], [], color=BASE, label="without warming (baseline)"),
        Line2D([], [], **DEPLOY, label="model deploy"),
        Line2D([], [], **KB, label="knowledge-base change"),
    ]
    if any(rg.first_h > 0 for rg, _, _ in runs):
        handles.append(Rectangle((0, 0), 1, 1, color="0.92", label="hours not served"))
    fig.legend(handles=handles, loc="outside right upper")
    _title(fig, "Cache hit rate over week 2, with and without warming, per TTL regime")
    fig.supxlabel(SIMULATED, fontsize=8, color="grey")
    return _save(fig, out / "hit_rate.png")


def _events(ax: Axes, warm: PassResult) -> None:
    if warm.deploy:
        ax.axvline(warm.deploy["hour"], **DEPLOY)
    for inv in warm.invalidations:
        ax.axvline(inv["hour"], **KB)


def gpu_demand(regime: str, f: dict[str, Any], out: Path) -> Path:
    """GPU-seconds per hour: with warming as stacked bars (live misses, the scheduler's warm
    sends, the deploy's pre-warm, each send in the hour it goes out), without as a line; both
    peaks marked, and the lowest peak any warming could reach on this traffic."""
    per = f["gpu_s_per_hour"]
    first, n = f["hours"][0], len(per["baseline"])
    xs = list(range(first, first + n))
    sched, pre = per["scheduled_sends"], per["prewarm_sends"]
    live = [t - s for t, s in zip(per["with_warming"], per["warm_sends"], strict=True)]
    fig, ax = plt.subplots(figsize=(12, 4.2), layout="constrained")
    # hatched as well as coloured where a bar is wide enough to show it (a week's bars are
    # 3 px: white hatching there hid the colour)
    wide = n <= 48
    ax.bar(xs, live, width=0.8, color=WARM, alpha=0.55, label="with warming: live misses")
    ax.bar(xs, sched, width=0.8, bottom=live, color=SENDS, hatch="//" if wide else None,
           edgecolor="white", linewidth=0, label="with warming: scheduled warm sends")  # fmt: skip
    lower = [a + b for a, b in zip(live, sched, strict=True)]
    ax.bar(xs, pre, width=0.8, bottom=lower, color=PREWARM, hatch="xx" if wide else None,
           edgecolor="white", linewidth=0, label="with warming: the deploy's pre-warm")  # fmt: skip
    ax.step(xs, per["baseline"], where="mid", color=BASE, linewidth=1.4, label="without warming")
    _mark_peaks(ax, xs, per["with_warming"], per["baseline"], f)
    if any(pre):  # a week's bars are 3 px wide: a mark on the axis finds the pre-warm's hour
        i = max(range(n), key=pre.__getitem__)
        ax.plot([xs[i]], [0], marker="^", markersize=9, color=PREWARM, clip_on=False,
                linestyle="none", label=f"the pre-warm's hour: {xs[i]}, {pre[i]:,.0f} GPU-s")  # fmt: skip
    bound = f.get("peak_gpu_ratio_bound")
    if bound:
        floor = bound * f["peak_gpu_s_baseline"]
        ax.axhline(floor, color="grey", linestyle=":", linewidth=1.2,
                   label=f"lowest peak any warming could reach: {floor:,.0f} GPU-s ({bound:.2f}x)")  # fmt: skip
    d = f.get("deploy") or {}
    if d.get("hour") is not None:
        ax.axvline(d["hour"] - 0.5, **DEPLOY, zorder=0, label=f"model deploy (hour {d['hour']})")
    ax.set_xlim(first - 0.6, first + n - 0.4)
    ax.set_ylim(0, 1.22 * max([*per["with_warming"], *per["baseline"], 1.0]))
    ax.set_xlabel("hour of week 2")
    ax.set_ylabel("GPU-seconds")
    ax.set_title(textwrap.fill(f["verdict"], 85), loc="left", fontsize=9)
    _title(fig, f"GPU demand per hour, {regime} ({regime_title(f)})")
    fig.legend(loc="outside right upper", fontsize=9)
    fig.supxlabel(
        f"{SIMULATED}; a warm send is priced at its query's logged miss cost", fontsize=8,
        color="grey",
    )  # fmt: skip
    return _save(fig, out / f"gpu_demand_{regime}.png")


def _mark_peaks(
    ax: Axes, xs: list[int], warm: list[float], base: list[float], f: dict[str, Any]
) -> None:
    """Each peak: a marker above its hour, its figures in the legend, a label above it."""
    iw = max(range(len(warm)), key=warm.__getitem__)
    ib = max(range(len(base)), key=base.__getitem__)
    ratio = f.get("peak_gpu_ratio")
    ratio_s = "" if ratio is None else f", {ratio:.2f}x"
    lift = 0.04 * max(warm[iw], base[ib])  # the marker sits just above its bar or step
    ax.plot([xs[iw]], [warm[iw] + lift], marker="v", color=WARM, markersize=9, linestyle="none",
            label=f"peak with warming: {warm[iw]:,.0f} GPU-s, hour {xs[iw]}{ratio_s}")  # fmt: skip
    ax.plot([xs[ib]], [base[ib] + lift], marker="v", color=BASE, markersize=9,
            linestyle="none", label=f"peak without: {base[ib]:,.0f} GPU-s, hour {xs[ib]}")  # fmt: skip
    # a label over each marker; one over the higher when the peaks are too close for two
    marks = [(iw, warm[iw], "peak with warming"), (ib, base[ib], "peak without")]
    if abs(iw - ib) < 4:
        marks = [max(marks, key=lambda m: m[1])]
        marks = [(marks[0][0], marks[0][1], "both peaks" if iw == ib else "peaks")]
    for i, y, text in marks:
        ax.annotate(text, (xs[i], y + lift), xytext=(0, 8), textcoords="offset points",
                    ha="center", fontsize=8)  # fmt: skip


def warm_qps(sc: Scenario, warm: PassResult, f: dict[str, Any], out: Path) -> Path:
    """The warm sends of each window (what landed, what did not, what was priced out before
    it went) and the deploy's pre-warm, over the rate each window's sends achieved."""
    ws = warm.warm_windows
    hours = [w["hour"] for w in ws]
    bad = [w.get("refused_stale", 0) + w.get("failed", 0) for w in ws]
    landed = [w.get("sent", 0) - x for w, x in zip(ws, bad, strict=True)]
    priced = [w.get("priced_out", 0) for w in ws]
    # the deploy's pre-warm goes out at the deploy, as the sends of the window starting then
    # would: stacked on that window's bar
    deploy_h = warm.deploy.get("hour") if warm.deploy else None
    sent = [(h, w["achieved_qps"]) for h, w in zip(hours, ws, strict=True) if w.get("sent")]
    # ... and, announced ahead, its sends in each lead hour (demo/headroom.py)
    pre_at: dict[int, int] = {}
    for x in warm.lead_warms:
        pre_at[x["hour"]] = pre_at.get(x["hour"], 0) + x.get("sent", 0)
    if deploy_h is not None and warm.prewarms:
        pre_at[deploy_h] = pre_at.get(deploy_h, 0) + sum(p.sent for p in warm.prewarms)
    for h in sorted(set(pre_at) - set(hours)):
        hours, landed, bad, priced = [*hours, h], [*landed, 0], [*bad, 0], [*priced, 0]
    pre = [pre_at.get(h, 0) for h in hours]
    width = 0.6 * sc.warm_every_h
    fig, (top, low) = plt.subplots(2, 1, figsize=(11, 5.2), sharex=True, layout="constrained",
                                   height_ratios=(3, 2))  # fmt: skip
    bottom = [0.0] * len(hours)
    for values, style in (
        (landed, {"color": SENDS, "label": "scheduled, landed"}),
        (bad, {"color": BAD, "label": "scheduled, refused as stale or failed"}),
        (pre, {"color": PREWARM, "label": "the deploy's pre-warm"}),
        (priced, {"fill": False, "hatch": "..", "edgecolor": "grey",
                  "label": "planned, priced out at send time"}),
    ):  # fmt: skip
        top.bar(hours, values, width=width, bottom=bottom, **style)
        bottom = [a + b for a, b in zip(bottom, values, strict=True)]
    top.set_ylabel("warm requests")
    top.set_ylim(bottom=0)
    low.bar([h for h, _ in sent], [q for _, q in sent], width=width, color=QPS,
            label="achieved QPS of a window's sends")  # fmt: skip
    low.axhline(sc.warm_qps, color=QPS, linestyle="-.", label=f"cap: {sc.warm_qps:,.0f} QPS")
    low.set_ylabel("warm QPS")
    low.set_ylim(0, sc.warm_qps * 1.15)
    low.set_xlabel("warm window (the hour of week 2 it starts; its sends go out the hour before)")
    for ax in (top, low):
        ax.set_xlim(sc.first_h - 1, sc.week2_hours)
        if warm.deploy:
            ax.axvline(warm.deploy["hour"] - 0.5, **DEPLOY, zorder=0)
    handles = [*top.get_legend_handles_labels()[0], *low.get_legend_handles_labels()[0]]
    if warm.deploy:
        handles.append(Line2D([], [], **DEPLOY, label="model deploy"))
    fig.legend(handles=handles, loc="outside right upper", fontsize=9)
    _title(fig, f"Warm sends per window, {sc.regime} ({regime_title(f)})")
    fig.supxlabel(SIMULATED, fontsize=8, color="grey")
    return _save(fig, out / "warm_qps.png")


PHASES = {
    "prewarm": ("pre-warm of the new version", "tab:orange"),
    "grace": ("READY: the new version serves; grace", "tab:green"),
    "retire": ("retire the old version", "tab:olive"),
    "purge": ("staggered purge of the old", "tab:red"),
}


def purge_progress(sc: Scenario, warm: PassResult, f: dict[str, Any], out: Path) -> Path:
    """The deploy job's progress as stoker.status reported it, its phases shaded; each step of
    the purge is one paced batch."""
    fig, ax = plt.subplots(figsize=(12, 3.8), layout="constrained")
    d = warm.deploy
    pts = [
        (t - d["started_at"], st) for t, st in warm.statuses if d and st.job_id == d["deploy_id"]
    ]
    if pts:
        xs, ys = [t for t, _ in pts], [st.progress for _, st in pts]
        ax.step(xs, ys, where="post", color=BASE, label="progress (stoker.status)")
        ax.plot(xs, ys, "o", color=BASE, markersize=3)
        _phase_spans(ax, pts, d)
    ax.set_xlabel("seconds since the deploy event")
    ax.set_ylabel("cutover progress")
    ax.set_ylim(0, 1.05)
    ax.yaxis.set_major_formatter(PercentFormatter(1.0, decimals=0))
    fig.legend(loc="outside right upper", fontsize=9)
    _title(fig, f"Model-version cutover, {sc.regime} with warming")
    ax.set_title(regime_title(f), loc="left", fontsize=9)
    fig.supxlabel(
        "Redis purge paced by the demo so that its batches show (production: "
        "STOKER_DEPLOY_PURGE_BATCH, STOKER_DEPLOY_PURGE_RATE); the pre-warm runs against the "
        "simulated GPU backend",
        fontsize=8, color="grey",
    )  # fmt: skip
    return _save(fig, out / "purge_progress.png")


def _phase_spans(ax: Axes, pts: list[tuple[float, Any]], d: dict[str, Any]) -> None:
    """Shade each phase from its first status to the next phase's; the purge's label says how
    it was batched."""
    starts: list[tuple[str, float]] = []
    for t, st in pts:
        phase = st.detail.split(":", 1)[0]
        if not starts or starts[-1][0] != phase:
            starts.append((phase, t))
    counts = d.get("done_counts", {})
    for i, (phase, t) in enumerate(starts):
        if phase not in PHASES:
            continue
        label, color = PHASES[phase]
        if phase == "purge":
            label += (
                f": {counts.get('deleted', 0):,} keys in {counts.get('batches', 0)} batches of "
                f"<= {d.get('purge_batch', '?')}"
            )
        end = starts[i + 1][1] if i + 1 < len(starts) else pts[-1][0]
        ax.axvspan(t, max(end, t + 0.02), color=color, alpha=0.25, label=label)
    done = [t for t, st in pts if st.state == "done"]
    if done:
        ax.axvline(done[0], color="tab:green", linewidth=1.5, label=f"DONE at {done[0]:.1f} s")


def _title(fig: Figure, text: str) -> None:
    """Left-aligned, so it never runs under the legend on the right."""
    fig.suptitle(text, x=0.01, ha="left")


def _save(fig: Figure, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
