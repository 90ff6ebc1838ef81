"""The analysis end to end, and its report: rates per tenant, recommended settings, verdict.

Steps of `analyze`:
1. key every request (keyed_log), time-sorted;
2. over the embedding budget, keep a sample of prompts, whole (sample: what is estimated, how);
3. embed each unique normalised prompt once and build the neighbour graph (neighbours);
4. duplicates: exact and near (per threshold) against every earlier request;
5. simulate a cache per (threshold, TTL), plus exact-only per TTL (threshold None);
6. recommend a threshold and a TTL, and give the verdict.
The report is one JSON-ready dict whose shape does not depend on the data (SCHEMA names it).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pandas as pd

from audits.whatif.cache_replay import (
    EXACT,
    SEMANTIC,
    Duplicates,
    Replayed,
    duplicates,
    simulate,
)
from audits.whatif.keyed_log import KeyedLog, key_frame
from audits.whatif.neighbours import build_neighbours, embed_unique
from audits.whatif.recommend import recommend, verdict
from audits.whatif.sample import Sample, draw
from caches.embedders import Embedder

SCHEMA = "stoker.analyze/1"
Progress = Callable[[str, int, int], None]  # (stage "embed" | "simulate", done, total)


@dataclass(frozen=True)
class Settings:
    thresholds: tuple[float, ...] = (0.85, 0.88, 0.90, 0.92, 0.95, 0.98)
    ttls_s: tuple[int, ...] = (3_600, 6 * 3_600, 86_400, 7 * 86_400)
    labels: str | None = None
    # A threshold qualifies while under 1% of the answers the cache serves are wrong.
    max_false_share: float = 0.01
    # Distinct prompts embedded at most; past it, a sample (audits/whatif/sample.py).
    embed_budget: int | None = None


def analyze(
    frame: pd.DataFrame | KeyedLog,
    settings: Settings,
    embedder: Embedder,
    on_progress: Progress = lambda _s, _d, _t: None,
) -> dict[str, Any]:
    """frame: the raw table, or one key_frame already keyed (a caller that checks the log
    before it loads the embedder)."""
    clock = {"start": time.perf_counter()}
    full = frame if isinstance(frame, KeyedLog) else key_frame(frame, settings.labels)
    sample = draw(full, settings.embed_budget)
    log = sample.log
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
            grid.append({"threshold": thr, "ttl_s": ttl, **_sim_stats(sample, run)})
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
        "log": _log_facts(full),
        "sample": sample.facts,
        "settings": {
            "thresholds": list(settings.thresholds),
            "ttls_s": list(settings.ttls_s),
            "labels": settings.labels,
            "max_false_share": settings.max_false_share,
            "embedder": embedder.id,
            "capped_keys": nb.capped_keys,
        },
        "duplicates": _dup_stats(sample, dups, settings.thresholds),
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


def _per_tenant(sample: Sample, stats: Callable[[int | None], dict[str, Any]]) -> dict[str, Any]:
    """{"overall": stats(None), "tenants": {name: stats(that tenant's index)}}."""
    return {
        "overall": stats(None),
        "tenants": {name: stats(i) for i, name in enumerate(sample.log.tenants)},
    }


def _sim_stats(sample: Sample, run: Replayed) -> dict[str, Any]:
    log = sample.log
    exact, semantic = run.outcome == EXACT, run.outcome == SEMANTIC
    hit = exact | semantic
    labelled = log.label is not None
    # semantic hits a sample misses (its bias, sample.py): half the bound counts, the interval
    # spans all of it; zero when nothing was sampled
    unseen = sample.unseen(run.served_by)
    semantic_est, hit_est = semantic + unseen / 2, hit + unseen / 2

    def stats(tenant: int | None) -> dict[str, Any]:
        gpu_all = sample.gpu_ms[tenant] / 1000
        saved = sample.total(hit_est * log.gpu_ms, tenant) / 1000
        false = sample.total(run.false_hit, tenant)
        hits = sample.total(hit_est, tenant)
        return {
            "requests": sample.requests[tenant],
            "hit_rate_exact": sample.rate_of(exact, tenant),
            "hit_rate_semantic": sample.rate_of(semantic_est, tenant),
            "hit_rate_total": sample.rate_of(hit_est, tenant),
            # 95% interval of the estimate (a point when nothing was sampled)
            "hit_rate_total_ci": sample.interval(hit, tenant, sample.requests[tenant], unseen),
            "gpu_seconds": round(gpu_all, 3),
            "gpu_seconds_saved": round(saved, 3),
            "gpu_seconds_saved_pct": round(100 * saved / gpu_all, 3) if gpu_all else 0.0,
            "false_hits": round(false) if labelled else None,
            # of the answers the cache serves, the share that is wrong
            "false_hit_share": (round(false / hits, 6) if hits else 0.0) if labelled else None,
        }

    return _per_tenant(sample, stats)


def _dup_stats(sample: Sample, dups: Duplicates, thresholds: tuple[float, ...]) -> dict[str, Any]:
    bypass = sample.log.key < 0

    def stats(tenant: int | None) -> dict[str, Any]:
        exact = sample.rate_of(dups.exact, tenant)
        near = [
            {
                "threshold": thr,
                "near_dup_rate": sample.rate_of(dups.near[thr], tenant),
                "repeatable_rate": round(exact + sample.rate_of(dups.near[thr], tenant), 6),
            }
            for thr in thresholds
        ]
        return {
            "requests": sample.requests[tenant],
            "uncacheable_rate": sample.rate_of(bypass, tenant),
            "exact_dup_rate": exact,
            "near_dup": near,
        }

    return _per_tenant(sample, stats)
