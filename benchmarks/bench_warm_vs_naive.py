"""`stoker warm` with a named budget against a naive top-K, on traffic shapes and the sample log.

What a user runs: `stoker warm --window W --budget-requests K --dry-run`, with every setting at
its default. Per dataset (the five shapes of simulation/logs/shapes.py and the sample log) and
seed, a two-week log fills a TrafficProfile on a real redis-server through the traffic worker's
observe path, in time order: before each window the profile holds every request before it, as
a live traffic worker's would. 12 one-hour windows of week 2 (days 8-13 at 04:00 and 14:00,
nights included). Per tenant and window, the plan of the shipped runner (stoker.stack.Stack,
default settings, its clock 5 minutes before the window) for a named budget of K sends.

Coverage = the share of the window's requests the warmed entries would serve: the same
normalised text, or a cosine >= 0.92 (the serving threshold) to a warmed prompt, with
all-MiniLM-L6-v2 (no label is read: the cache cannot read them either).
- naive: per tenant, the K most asked normalised prompts of everything before the window;
- oracle: per tenant-window, K prompts chosen by greedy maximum coverage of the window's own
  requests (it sees the future).
Rows `warm_vs_naive_k<K>`, one per dataset: coverage, naive, oracle, ratio_vs_naive (goal >= 1.0
in the mean over seeds, no seed below 0.95), ratio_vs_oracle, items planned (mean per plan),
plan_s_max. `--seeds N` (default 3): N logs per dataset; `over_seeds` has each figure's mean,
sd, min and max.

Rows `warm_vs_naive_7d_k<K>` (`--history-days 7`): the same, the profile and naive holding only
the week before each window: planning from a single week.

Rows `hot_set_drift_k<K>` (drift and incident shapes): a trend or an incident that has lasted
2 hours. Windows: 2 hours after each incident of the incident shape began, and 2 hours into
week 2 of the drift shape, whose rising intents jumped x6 at its start. The planner is the
same; scored on the surging requests alone (the intents no week 1 asked, or asked 4x more
in week 2 than in week 1: the label is read here, to score): coverage, and ratio_vs_oracle
against K of the window's own surging prompts (goal >= 0.5); history_bound: what warming every
text the tenant asked before the window would cover (any K: what no forecast from the log can
beat), and history_bound_vs_oracle, the same in the oracle's units.
"""

from __future__ import annotations

import argparse
import time
from datetime import datetime, timedelta
from pathlib import Path

import pandas as pd
from _common import SeedRows, shipped_embedder
from _coverage import Scorer
from bench_hot_set import DiskCachedEmbedder

from caches.keys import normalise_prompt
from simulation.logs import sample, shapes
from stoker.embedded import EmbeddedStack
from stoker.stack import Stack
from streams.replay import to_event
from warmers.hotset.warm_budget import Budget
from warmers.hotset.window import Window
from warmers.traffic.profile import TrafficProfile
from warmers.traffic.worker import observe_event

WINDOWS = [sample.START + timedelta(days=d, hours=h) for d in range(8, 14) for h in (4, 14)]
# 2 hours into each incident (shapes.INCIDENTS: slot, day, hour, hours), and into week 2 of
# the drift shape (its rising intents jump at its start)
DRIFT_WINDOWS = {
    "incident": [sample.START + timedelta(days=d, hours=h + 2) for _, d, h, _ in shapes.INCIDENTS],
    "drift": [
        sample.START + timedelta(days=7, hours=2),
        sample.START + timedelta(days=7, hours=10),
    ],
}
DATASETS = (*shapes.SHAPES, "sample")
MAX_S = 3_600  # per dataset and seed: a bound, not a target
PLANNED_AT = timedelta(minutes=5)  # the user runs `stoker warm` this long before the window


def log_of(dataset: str, seed_index: int) -> pd.DataFrame:
    """The dataset's log made with its spec's seed + seed_index."""
    if dataset == "sample":
        return sample.generate(sample.SampleSpec(seed=sample.SampleSpec().seed + seed_index))
    return shapes.generate(
        shapes.ShapeSpec(dataset, seed=shapes.ShapeSpec(dataset).seed + seed_index)
    )


def fill(profile: TrafficProfile, rows: pd.DataFrame, first: int) -> None:
    """The rows into the profile through the traffic worker's observe path (no Kafka)."""
    records = rows.drop(columns=["intent", "norm"], errors="ignore").to_dict("records")
    obs = [
        observe_event(to_event(first + i, r), "bench:0", first + i) for i, r in enumerate(records)
    ]
    for i in range(0, len(obs), 5_000):
        profile.write(obs[i : i + 5_000])


class Clock:
    """The planner's now: set by the benchmark before each plan."""

    def __init__(self) -> None:
        self.now = WINDOWS[0]

    def __call__(self) -> datetime:
        return self.now


def surging(df: pd.DataFrame, dataset: str) -> set[str]:
    """The labels of the intents that surge in week 2 (scoring only)."""
    week2 = df["ts"] >= pd.Timestamp(sample.START + timedelta(days=7))
    one, two = df.loc[~week2, "intent"].value_counts(), df.loc[week2, "intent"].value_counts()
    if dataset == "incident":
        return {i for i in two.index if i != "oos" and one.get(i, 0) == 0}
    return {i for i in two.index if i != "oos" and two[i] >= 4 * max(one.get(i, 0), 1)}


def run(
    dataset: str,
    seed_index: int,
    ks: list[int],
    emb: DiskCachedEmbedder,
    rows: SeedRows,
    drift: bool = False,
    history_days: int | None = None,
) -> None:
    df = log_of(dataset, seed_index)
    windows = DRIFT_WINDOWS[dataset] if drift else WINDOWS
    surge = surging(df, dataset) if drift else set()
    df["norm"] = [normalise_prompt(p) for p in df["prompt"]]
    scorer = Scorer(emb)
    scorer.vecs(sorted(set(df["norm"])))  # every text once, up front (and into the disk cache)
    emb.save()
    tally = {k: {"ours": 0, "naive": 0, "oracle": 0, "items": 0, "plans": 0} for k in ks}
    seen = 0  # drift: what warming every text asked before the window would serve
    total, plan_s, started = 0, 0.0, time.perf_counter()
    clock = Clock()
    with EmbeddedStack(kafka=False) as embedded, Stack(embedded.settings(), clock=clock) as stack:
        runner = stack.runner(dry_run=True, progress=False)
        done = 0
        for start in windows:
            if time.perf_counter() - started > MAX_S:
                raise SystemExit(f"{dataset}: over {MAX_S} s, stopped")
            before = int((df["ts"] < pd.Timestamp(start)).sum())
            if history_days is None:
                fill(stack.profile, df.iloc[done:before], done)
            else:  # only the last days before the window, in a profile of its own
                stack.redis.flushdb()
                runner = stack.runner(dry_run=True, progress=False)
                done = int((df["ts"] < pd.Timestamp(start - timedelta(days=history_days))).sum())
                fill(stack.profile, df.iloc[done:before], done)
            past = df.iloc[done if history_days is not None else 0 : before]
            done = before
            clock.now = start - PLANNED_AT
            end = start + timedelta(hours=1)
            window = df[(df["ts"] >= pd.Timestamp(start)) & (df["ts"] < pd.Timestamp(end))]
            if drift:
                window = window[window["intent"].isin(surge)]
            for tenant in sorted(df["tenant"].unique()):
                asked = window.loc[window["tenant"] == tenant, "norm"].tolist()
                total += len(asked)
                history = past.loc[past["tenant"] == tenant, "norm"].value_counts()
                if drift:
                    seen += scorer.served(asked, history.index.tolist())
                for k in ks:
                    t0 = time.perf_counter()
                    plan = runner.plan(
                        Window(start, end), Budget(requests=k), tenants=[tenant], named=True
                    )
                    plan_s = max(plan_s, time.perf_counter() - t0)
                    warmed = [normalise_prompt(i.item.request.prompt) for i in plan.items]
                    t = tally[k]
                    t["ours"] += scorer.served(asked, warmed)
                    t["naive"] += scorer.served(asked, history.index[:k].tolist())
                    t["oracle"] += scorer.oracle(asked, k)
                    t["items"] += len(plan.items)
                    t["plans"] += 1
    emb.save()
    for k in ks:
        t = tally[k]
        if drift:
            rows.add(
                f"hot_set_drift_k{k}", dataset=dataset, k=k, windows=len(windows),
                surge_requests=total, coverage=round(t["ours"] / max(total, 1), 4),
                oracle=round(t["oracle"] / max(total, 1), 4),
                ratio_vs_oracle=round(t["ours"] / max(t["oracle"], 1), 4), goal_ratio_vs_oracle=0.5,
                history_bound=round(seen / max(total, 1), 4),
                history_bound_vs_oracle=round(seen / max(t["oracle"], 1), 4),
            )  # fmt: skip
            continue
        name = "warm_vs_naive" if history_days is None else f"warm_vs_naive_{history_days}d"
        rows.add(
            f"{name}_k{k}", dataset=dataset, k=k, windows=len(WINDOWS), requests=total,
            history_days=history_days,
            coverage=round(t["ours"] / total, 4), naive=round(t["naive"] / total, 4),
            oracle=round(t["oracle"] / total, 4),
            ratio_vs_naive=round(t["ours"] / max(t["naive"], 1), 4),
            ratio_vs_oracle=round(t["ours"] / max(t["oracle"], 1), 4),
            items_per_plan=round(t["items"] / max(t["plans"], 1), 1), plan_s_max=round(plan_s, 2),
            goal_ratio_vs_naive_min=1.0,
        )  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--datasets", default=",".join(DATASETS))
    ap.add_argument("--ks", default="50,200,1000")
    ap.add_argument("--embed-cache", type=Path, default=Path("/tmp/stoker-shapes-embed.npz"))
    ap.add_argument("--seeds", type=int, default=3, metavar="N", help="logs per dataset")
    ap.add_argument(
        "--drift", action="store_true",
        help="the hot_set_drift rows instead: windows 2 hours into a trend or an incident",
    )  # fmt: skip
    ap.add_argument(
        "--history-days", type=int, default=None, metavar="N",
        help="the warm_vs_naive_<N>d rows: the profile, and naive, hold only the N days before "
        "each window (7: planning from a single week)",
    )  # fmt: skip
    args = ap.parse_args()
    if args.seeds < 1:
        ap.error("--seeds: at least 1")
    unknown = set(args.datasets.split(",")) - set(DATASETS)
    if unknown:
        ap.error(f"--datasets: unknown {', '.join(sorted(unknown))}; one of {', '.join(DATASETS)}")
    emb = DiskCachedEmbedder(shipped_embedder(bulk=True), args.embed_cache)
    ks = [int(x) for x in args.ks.split(",")]
    datasets = tuple(DRIFT_WINDOWS) if args.drift else args.datasets.split(",")
    for dataset in datasets:
        rows = SeedRows()
        for i in range(args.seeds):
            run(dataset, i, ks, emb, rows, drift=args.drift, history_days=args.history_days)
        rows.emit(list(range(args.seeds)))


if __name__ == "__main__":
    main()
