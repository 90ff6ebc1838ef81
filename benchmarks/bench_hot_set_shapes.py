"""Hot-set coverage on traffic shapes the planner was not built for, scored at the serving threshold.

For each shape of simulation/logs/shapes.py (drift, surge, incident, longtail, quiet), a
two-week log fills a TrafficProfile on a real redis-server through the traffic worker's observe
path, in time order: before each window the profile holds every request before it, as a live
traffic worker's would (so the live log of the current day counts). 12 one-hour windows of week
2 (days 8-13 at 04:00 and 14:00; the incidents and the quiet nights fall on some of them). Per
tenant and window, a plan for a budget of K warm sends, through the code `stoker warm` runs
(ranked past break-even, min_value_ms=None, so K buys K items).

Coverage = the share of the window's requests the warmed entries would serve: the same
normalised text, or a cosine >= 0.92 (the serving threshold) to a warmed representative, with
all-MiniLM-L6-v2 (no label is read: the cache cannot read them either).
- oracle: per tenant-window, K representatives chosen by greedy maximum coverage of the window's
  own requests (it sees the future);
- naive: per tenant, the K most asked normalised prompts of everything before the window.
ratio = coverage / oracle, ratio_vs_naive = coverage / naive. Goal: ratio_vs_naive >= 1.0 on
every shape and K. plan_s_max: the slowest plan in process (its embedder disk-cached).
`--seeds N` (default 3): N logs per shape, from the spec's seed on; each row's numbers are the
means over them, and `over_seeds` has each one's mean, sd, min and max.

Row `warm_dry_run_<shape>`: `stoker warm --dry-run --json` as a user runs it, a new process
against the same Redis once the profile holds all of it but the last window, for that window and
a budget of the largest K, the embedding cache holding every earlier prompt (as the gateway that
served them left it): `cli_s` is the whole command (start-up, model load), `plan_s` the plan alone
as the command reports it (goal: the window planned in <= 10 s).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from datetime import datetime, timedelta
from pathlib import Path

import orjson
import pandas as pd
from _common import ROOT, SeedRows, emit
from _coverage import Scorer
from bench_hot_set import DiskCachedEmbedder

from caches.embedders import CachedEmbedder, SentenceTransformerEmbedder
from caches.keys import normalise_prompt
from caches.policy import CachePolicy
from simulation.logs.sample import START
from simulation.logs.shapes import SHAPES, ShapeSpec, generate
from stoker.embedded import EmbeddedStack
from stoker.wiring import build_redis
from streams.replay import to_event
from warmers.hotset.options import HotSetConfig
from warmers.hotset.paraphrase import TextVectors
from warmers.hotset.select import HotSetSelector
from warmers.hotset.warm_budget import Budget
from warmers.hotset.window import Window
from warmers.traffic.profile import TrafficProfile
from warmers.traffic.worker import observe_event

WINDOWS = [START + timedelta(days=d, hours=h) for d in range(8, 14) for h in (4, 14)]
MAX_S = 3_600  # per shape, all windows and budgets: a bound, not a target


def fill(profile: TrafficProfile, rows: pd.DataFrame, first: int) -> None:
    records = rows.drop(columns=["intent"]).to_dict("records")
    obs = [
        observe_event(to_event(first + i, r), "shape:0", first + i) for i, r in enumerate(records)
    ]
    for i in range(0, len(obs), 5_000):
        profile.write(obs[i : i + 5_000])


def run_shape(
    shape: str, ks: list[int], emb: DiskCachedEmbedder, seed: int, rows: SeedRows, dry: bool
) -> None:
    """One shape's log made with `seed`: its rows into `rows`; with `dry`, the dry-run row."""
    df = generate(ShapeSpec(shape, seed=seed))
    df["norm"] = [normalise_prompt(p) for p in df["prompt"]]
    scorer = Scorer(emb)
    scorer.vecs(sorted(set(df["norm"])))  # every text once, up front (and into the disk cache)
    emb.save()
    tally = {k: {"ours": 0, "naive": 0, "oracle": 0} for k in ks}
    total, plan_s, started = 0, 0.0, time.perf_counter()
    with EmbeddedStack(kafka=False) as stack:
        profile = TrafficProfile(build_redis(stack.settings()))
        sel = HotSetSelector(
            profile,
            TextVectors(emb),
            policy=CachePolicy(),
            config=HotSetConfig(min_value_ms=None, matcher="static", value_model="hits"),
        )
        done = 0
        for start in WINDOWS:
            if time.perf_counter() - started > MAX_S:
                raise SystemExit(f"{shape}: over {MAX_S} s, stopped")
            before = int((df["ts"] < pd.Timestamp(start)).sum())
            fill(profile, df.iloc[done:before], done)
            done = before
            past = df.iloc[:before]
            window = df[
                (df["ts"] >= pd.Timestamp(start))
                & (df["ts"] < pd.Timestamp(start + timedelta(hours=1)))
            ]
            for tenant in sorted(df["tenant"].unique()):
                asked = window.loc[window["tenant"] == tenant, "norm"].tolist()
                total += len(asked)
                history = past.loc[past["tenant"] == tenant, "norm"].value_counts()
                for k in ks:
                    t0 = time.perf_counter()
                    plan = sel.plan(
                        Window(start, start + timedelta(hours=1)),
                        Budget(requests=k),
                        tenants=[tenant],
                    )
                    plan_s = max(plan_s, time.perf_counter() - t0)
                    warmed = [normalise_prompt(i.item.request.prompt) for i in plan.items]
                    tally[k]["ours"] += scorer.served(asked, warmed)
                    tally[k]["naive"] += scorer.served(asked, history.index[:k].tolist())
                    tally[k]["oracle"] += scorer.oracle(asked, k)
        # what a gateway serving this traffic holds: the embedding of every prompt it served
        cached = CachedEmbedder(emb, profile.r, 30 * 86_400)
        seen = df.iloc[:done]
        for tenant, texts in seen.groupby("tenant")["norm"]:
            uniq = sorted(set(texts))
            cached.prime(str(tenant), uniq, scorer.vecs(uniq))
        if dry:
            dry_run(shape, stack.redis_url, WINDOWS[-1], max(ks))
    emb.save()
    for k in ks:
        t = tally[k]
        rows.add(
            f"hot_set_{shape}_k{k}_t092", shape=shape, k=k, windows=len(WINDOWS), requests=total,
            coverage=round(t["ours"] / total, 4), oracle=round(t["oracle"] / total, 4),
            naive=round(t["naive"] / total, 4), ratio=round(t["ours"] / max(t["oracle"], 1), 4),
            ratio_vs_naive=round(t["ours"] / max(t["naive"], 1), 4), plan_s_max=round(plan_s, 2),
        )  # fmt: skip


def dry_run(shape: str, redis_url: str, start: datetime, k: int) -> None:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "STOKER_REDIS_URL": redis_url}
    span = f"{start.isoformat()}..{(start + timedelta(hours=1)).isoformat()}"
    argv = [sys.executable, "-m", "stoker.cli", "warm", "--dry-run", "--json", "--window", span,
            "--budget-requests", str(k)]  # fmt: skip
    t0 = time.perf_counter()
    out = subprocess.run(
        argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600, check=False
    )
    cli_s = time.perf_counter() - t0
    if out.returncode != 0:
        raise SystemExit(f"warm --dry-run failed ({out.returncode}): {out.stderr[-3000:]}")
    plan = orjson.loads(out.stdout)
    emit(
        f"warm_dry_run_{shape}", shape=shape, k=k, cli_s=round(cli_s, 2),
        plan_s=plan.get("plan_s"), items=len(plan.get("items", [])), goal_s_max=10.0,
    )  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--ks", default="50,200,1000")
    ap.add_argument("--embed-cache", type=Path, default=Path("/tmp/stoker-shapes-embed.npz"))
    ap.add_argument(
        "--seeds", type=int, default=3, metavar="N",
        help="logs per shape, made with the spec's seed and the next ones; each coverage row is"
        " the mean over them, with over_seeds (mean, sd, min, max)",
    )  # fmt: skip
    args = ap.parse_args()
    if args.seeds < 1:
        ap.error("--seeds: at least 1")
    emb = DiskCachedEmbedder(SentenceTransformerEmbedder(), args.embed_cache)
    ks = [int(x) for x in args.ks.split(",")]
    first = ShapeSpec(SHAPES[0]).seed
    seeds = list(range(first, first + args.seeds))
    for shape in args.shapes.split(","):
        rows = SeedRows()  # each shape's rows as soon as its seeds are done
        for seed in seeds:
            run_shape(shape, ks, emb, seed, rows, dry=seed == first)
        rows.emit(seeds)


if __name__ == "__main__":
    main()
