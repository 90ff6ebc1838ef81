"""The analysis end to end, and its report: rates per tenant, recommended settings, verdict.

Steps of `analyze`:
1. key every request (keyed_log), time-sorted;
2. embed each unique normalised prompt once and build the neighbour graph (neighbours);
3. duplicates: exact and near (per threshold) against every earlier request;
4. simulate a cache per (threshold, TTL), plus exact-only per TTL (threshold None);
5. recommend a threshold and a TTL, and give the verdict.
The report is one JSON-ready dict whose shape does not depend on the data (SCHEMA names it).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import pandas as pd

from caches.embedders import Embedder
from warmers.analysis.keyed_log import KeyedLog, key_frame
from warmers.analysis.neighbours import build_neighbours, embed_unique
from warmers.analysis.recommend import recommend, verdict
from warmers.analysis.simulation import EXACT, SEMANTIC, Duplicates, duplicates, simulate

SCHEMA = "stoker.analyze/1"
Progress = Callable[[str, int, int], None]  # (stage "embed" | "simulate", done, total)


@dataclass(frozen=True)
class Settings:
    thresholds: tuple[float, ...] = (0.85, 0.88, 0.90, 0.92, 0.95, 0.98)
    ttls_s: tuple[int, ...] = (3_600, 6 * 3_600, 86_400, 7 * 86_400)
    labels: str | None = None
    # A threshold qualifies while under 1% of the answers the cache serves are wrong.
    max_false_share: float = 0.01


def analyze(
    frame: pd.DataFrame,
    settings: Settings,
    embedder: Embedder,
    on_progress: Progress = lambda _s, _d, _t: None,
) -> dict[str, Any]:
    clock = {"start": time.perf_counter()}
    log = key_frame(frame, settings.labels)
    clock["keyed"] = time.perf_counter()
    vecs = embed_unique(log.key_prompt, embedder, lambda d, t: on_progress("embed", d, t))
    nb = build_neighbours(log.key_group, vecs, min(settings.thresholds, default=1.0))
    clock["embedded"] = time.perf_counter()
    dups = duplicates(log, nb, settings.thresholds)
    grid: list[dict[str, Any]] = []
    total = (len(settings.thresholds) + 1) * len(settings.ttls_s)
    on_progress("simulate", 0, total)
    for thr in (None, *settings.thresholds):
        cands = nb.candidates(thr) if thr is not None else None
        for ttl in settings.ttls_s:
            run = simulate(log, cands, ttl)
            grid.append(
                {"threshold": thr, "ttl_s": ttl, **_sim_stats(log, run.outcome, run.false_hit)}
            )
            on_progress("simulate", len(grid), total)
    clock["simulated"] = time.perf_counter()
    rec = recommend(
        grid, settings.thresholds, settings.ttls_s, settings.max_false_share, log.label is not None
    )
    chosen = next(
        g for g in grid if (g["threshold"], g["ttl_s"]) == (rec["threshold"], rec["ttl_s"])
    )
    return {
        "schema": SCHEMA,
        "log": _log_facts(log),
        "settings": {
            "thresholds": list(settings.thresholds),
            "ttls_s": list(settings.ttls_s),
            "labels": settings.labels,
            "max_false_share": settings.max_false_share,
            "embedder": embedder.id,
            "capped_keys": nb.capped_keys,
        },
        "duplicates": _dup_stats(log, dups, settings.thresholds),
        "simulation": grid,
        "recommendation": rec,
        "verdict": verdict(chosen["overall"]["hit_rate_total"]),
        "runtime_s": {
            "key": round(clock["keyed"] - clock["start"], 3),
            "embed": round(clock["embedded"] - clock["keyed"], 3),
            "simulate": round(clock["simulated"] - clock["embedded"], 3),
        },
    }  # fmt: skip


def _log_facts(log: KeyedLog) -> dict[str, Any]:
    span = (log.ts[0], log.ts[-1]) if log.requests else (None, None)
    iso = [
        None if s is None else pd.Timestamp(round(s), unit="s", tz="UTC").isoformat() for s in span
    ]
    return {
        "rows": log.rows,
        "requests": log.requests,
        "bad_rows": sum(log.bad.values()),
        "bad_reasons": dict(sorted(log.bad.items())),
        "tenants": list(log.tenants),
        "unique_keys": len(log.key_prompt),
        "from": iso[0],
        "to": iso[1],
    }


def _per_tenant(
    log: KeyedLog, stats: Callable[[npt.NDArray[np.bool_]], dict[str, Any]]
) -> dict[str, Any]:
    """{"overall": stats(all rows), "tenants": {name: stats(that tenant's rows)}}."""
    return {
        "overall": stats(np.ones(log.requests, dtype=np.bool_)),
        "tenants": {name: stats(log.tenant == i) for i, name in enumerate(log.tenants)},
    }


def _rate(part: npt.NDArray[np.bool_], rows: npt.NDArray[np.bool_]) -> float:
    n = int(rows.sum())
    return round(float((part & rows).sum()) / n, 6) if n else 0.0


def _sim_stats(
    log: KeyedLog, outcome: npt.NDArray[np.int8], false_hit: npt.NDArray[np.bool_]
) -> dict[str, Any]:
    exact, semantic = outcome == EXACT, outcome == SEMANTIC
    labelled = log.label is not None

    def stats(rows: npt.NDArray[np.bool_]) -> dict[str, Any]:
        hits = (exact | semantic) & rows
        gpu_all = float(log.gpu_ms[rows].sum()) / 1000
        saved = float(log.gpu_ms[hits].sum()) / 1000
        false = int((false_hit & rows).sum())
        return {
            "requests": int(rows.sum()),
            "hit_rate_exact": _rate(exact, rows),
            "hit_rate_semantic": _rate(semantic, rows),
            "hit_rate_total": _rate(exact | semantic, rows),
            "gpu_seconds": round(gpu_all, 3),
            "gpu_seconds_saved": round(saved, 3),
            "gpu_seconds_saved_pct": round(100 * saved / gpu_all, 3) if gpu_all else 0.0,
            "false_hits": false if labelled else None,
            # of the answers the cache serves, the share that is wrong
            "false_hit_share": (round(false / int(hits.sum()), 6) if hits.any() else 0.0)
            if labelled
            else None,
        }

    return _per_tenant(log, stats)


def _dup_stats(log: KeyedLog, dups: Duplicates, thresholds: tuple[float, ...]) -> dict[str, Any]:
    bypass = log.key < 0

    def stats(rows: npt.NDArray[np.bool_]) -> dict[str, Any]:
        exact = _rate(dups.exact, rows)
        near = [
            {
                "threshold": thr,
                "near_dup_rate": _rate(dups.near[thr], rows),
                "repeatable_rate": round(exact + _rate(dups.near[thr], rows), 6),
            }
            for thr in thresholds
        ]
        return {
            "requests": int(rows.sum()),
            "uncacheable_rate": _rate(bypass, rows),
            "exact_dup_rate": exact,
            "near_dup": near,
        }

    return _per_tenant(log, stats)
