"""Hot-set quality on the two-week sample log: a week-1 profile chooses what week 2 needs.

A study of the selection, not of what ships: its arms plan with settings other than the
defaults (valued by hits, ranked past break-even, min_value_ms=None, so K buys K items; the
static matcher's clusters), and every row names them in `settings`. What `stoker warm` does
with its defaults is bench_warm_vs_naive.py's; what the scheduler does, bench_analyze_warming.py's.

`--seeds N` (default 3): the committed log (seed 150) and N-1 more of the same spec made with
the next seeds (simulation/logs/sample.py); each row's numbers are the means over the logs, and
`over_seeds` has each one's mean, sd, min and max. One log is not a measurement.

Protocol (per day): week 1's rows fill a TrafficProfile on a real redis-server through the
traffic worker's own observe path (no Kafka). For each tenant and each day of week 2, the
selector plans a 24-hour window with a budget of K warm requests for that tenant alone, through
the same code path `stoker warm` runs (day regimes, smoothed expected hits, paraphrase clusters
at the given cosine threshold, ranking by hits x GPU cost; ranked past break-even,
min_value_ms=None, so a budget of K buys K items as the protocol asks). Coverage = the share of that
tenant-day's week-2 requests that are cacheable and whose intent is the intent of a warmed
representative (labels are read only here, to score).
- oracle: per tenant-day, the K intents with the most cacheable week-2 requests (it sees week 2);
- naive: per tenant, the global top-K prompts of week 1 (no time, no paraphrases), every day.
ratio = coverage / oracle; ratio_vs_naive = coverage / naive. Goal: >= 0.9 and > 1.

Two clustering radii are reported: the serving default (0.92, what the semantic cache would
answer from one warmed entry) as `hot_set_k<K>_t092_intents`, and `--threshold` (default 0.5)
as `hot_set_k<K>`, both scored by intent as above. all-MiniLM-L6-v2 scores few CLINC paraphrase
pairs >= 0.92 (2% of same-intent pairs; 37% at 0.6), so the tight radius warms several phrasings
per intent, and the intent score credits paraphrases the cache would never serve.

`hot_set_k<K>_t092` scores what the cache would serve (run_served): a cacheable week-2 request
counts when a warmed prompt is the same normalised text or within cosine 0.92; oracle = K of
the tenant-day's own prompts by greedy maximum coverage (new texts included, which no warm can
send), oracle_logged = K of the tenant's week-1 prompts, chosen the same way knowing the day
(ratio_logged = coverage / oracle_logged). No label is read.

`hot_set_k<K>_verified_l<level>` scores the same days under the default (verified) matcher held
at one level (_verified.py): the plan made for that matcher (HotSetConfig.matcher="verified":
no paraphrase merged), the 0.92-clustered plan, naive and oracle_logged's choice. Its answers
come from the simulated backend told each prompt's intent label (read by it, not the matcher).

Measured here (embeddings cached with --embed-cache): intent-scored at 0.5, ratio 0.91 / 0.92 /
0.99 and ratio_vs_naive 1.26 / 1.16 / 1.03 for K = 50 / 200 / 1000; intent-scored at 0.92,
0.74 / 0.82 / 0.98; served at 0.92, ratio_logged 0.90 / 0.81 / 0.79 and ratio_vs_naive 1.08 /
1.04 / 1.03, where knowing week 2's rates reaches 0.95 / 0.90 / 0.93 of oracle_logged and the
plan covers 0.99 of what week 1's own best K covers (run_served). Under the verified matcher
held at level 3 (_verified.py; simulated answers), the plan for that matcher covers 0.275 /
0.417 / 0.571, 0.99 / 1.00 / 0.99 of naive; the 0.92-clustered plan covered 0.213 at K=50.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import orjson
import pandas as pd
from _common import ROOT, SeedRows, shipped_embedder
from _coverage import Scorer
from _verified import SimAnswers, VerifiedScorer

from caches.embedders import Embedder
from caches.keys import normalise_prompt
from caches.policy import CachePolicy
from simulation.logs.sample import SampleSpec, generate
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

SAMPLE = ROOT / "data" / "sample" / "requests-2w.parquet"
# the settings every arm plans with, beside the matcher each row names (not the defaults)
STUDY = "value_model=hits, min_value_ms=None (ranked past break-even)"
SAMPLE_SEED = SampleSpec().seed  # the committed log's (data/sample/README.md)
WEEK2 = datetime(2026, 11, 9, tzinfo=UTC)


class DiskCachedEmbedder(Embedder):
    """Embeddings kept in an .npz between runs (the model costs ~20 ms per text on a busy box)."""

    def __init__(self, inner: Embedder, path: Path | None) -> None:
        self.inner, self.path = inner, path
        self.id, self.dim = inner.id, inner.dim
        self.memo: dict[str, np.ndarray] = {}
        if path and path.exists():
            z = np.load(path, allow_pickle=False)
            self.memo = dict(zip(z["texts"].tolist(), z["vecs"], strict=True))

    def embed(self, texts: list[str]) -> np.ndarray:  # type: ignore[override]
        todo = [t for t in dict.fromkeys(texts) if t not in self.memo]
        if todo:
            self.memo.update(zip(todo, self.inner.embed(todo), strict=True))
        return np.stack([self.memo[t] for t in texts]).astype(np.float32)

    def save(self) -> None:
        if self.path:
            texts = list(self.memo)
            np.savez(
                self.path, texts=np.asarray(texts), vecs=np.stack([self.memo[t] for t in texts])
            )


def load(seed: int = SAMPLE_SEED) -> pd.DataFrame:
    """The sample log: the committed one, or the same spec generated with another seed."""
    df = pd.read_parquet(SAMPLE) if seed == SAMPLE_SEED else generate(SampleSpec(seed=seed))
    params = df["params"].map(orjson.loads)
    df["cacheable"] = [p.get("temperature", 0) == 0 and not p.get("no_cache") for p in params]
    df["day"] = (df["ts"] - pd.Timestamp("2026-11-02", tz="UTC")).dt.days
    df["norm"] = [normalise_prompt(p) for p in df["prompt"]]
    return df


def fill_profile(profile: TrafficProfile, rows: pd.DataFrame) -> None:
    records = rows.drop(columns=["intent", "cacheable", "day", "norm"]).to_dict("records")
    obs = [observe_event(to_event(i, r), "sample:0", i) for i, r in enumerate(records)]
    for i in range(0, len(obs), 5_000):
        profile.write(obs[i : i + 5_000])


def run(sel: HotSetSelector, df: pd.DataFrame, k: int) -> tuple[float, float, float]:
    w1, w2 = df[df["day"] < 7], df[df["day"] >= 7]
    intent_of = dict(zip(w1["prompt"], w1["intent"], strict=False))
    total = ours = oracle = naive = 0
    for tenant in sorted(df["tenant"].unique()):
        a = w1[(w1["tenant"] == tenant) & w1["cacheable"]]
        top = a.groupby(a["prompt"].str.lower().str.split().str.join(" ")).size().nlargest(k)
        naive_intents = {intent_of.get(p) for p in a["prompt"] if _norm(p) in top.index} - {"oos"}
        for day in range(7, 14):
            start = WEEK2 + timedelta(days=day - 7)
            plan = sel.plan(
                Window(start, start + timedelta(days=1)), Budget(requests=k), tenants=[tenant]
            )
            warmed = {intent_of.get(i.item.request.prompt) for i in plan.items} - {"oos", None}
            b = w2[(w2["tenant"] == tenant) & (w2["day"] == day)]
            ok = b[b["cacheable"] & (b["intent"] != "oos")]
            total += len(b)
            ours += int(ok["intent"].isin(warmed).sum())
            naive += int(ok["intent"].isin(naive_intents).sum())
            oracle += int(ok.groupby("intent").size().nlargest(k).sum())
    return ours / total, oracle / total, naive / total


def run_served(
    sel: HotSetSelector,
    df: pd.DataFrame,
    k: int,
    scorer: Scorer,
    verified: Mapping[int, VerifiedScorer] | None = None,
    vsel: HotSetSelector | None = None,
) -> dict[str, float]:
    """The same per-day protocol, scored as the cache would serve: a week-2 request counts when
    it is cacheable and a warmed prompt is the same normalised text or within the serving
    threshold (cosine >= 0.92). Two oracles, each K prompts chosen by greedy maximum coverage
    of the tenant-day's requests: of the day's own prompts (new texts included, which no warm
    could send), and of the tenant's week-1 prompts (what a warm can replay: a request it has
    seen logged). naive: week 1's K most asked prompts. No label is read.

    A third choice knows the rates but not the day: K of the week-1 prompts chosen the same
    way to cover all of week 2's requests of the day's kind (the 5 weekdays, or the weekend),
    the day itself included, and scored on each day. What it misses against oracle_logged is
    which of the rarely asked prompts a given day happens to ask: chance, which no forecast
    of rates can call. And one that knows week 1 only: K of its prompts chosen the same way to
    cover week 1's own requests (`history`), the most any fixed choice from the log alone
    covered there; the planner weighs hits by GPU cost, so it gives up a little of it.

    `verified` (level -> scorer): scored under the verified matcher held at that level
    (_verified.py), as `verified_l<level>_*`: the plan `vsel` makes for that matcher (no
    paraphrase merged: HotSetConfig.matcher), the 0.92-clustered plan above (`clustered`),
    naive, and oracle_logged's choice."""
    w1, w2 = df[df["day"] < 7], df[df["day"] >= 7]
    sums: dict[str, float] = {}

    def add(name: str, n: float) -> None:
        sums[name] = sums.get(name, 0) + n

    for tenant in sorted(df["tenant"].unique()):
        a = w1[(w1["tenant"] == tenant) & w1["cacheable"]]
        top = a["norm"].value_counts().index[:k].tolist()
        logged = sorted(set(a["norm"]))
        history = scorer.pick(a["norm"].tolist(), k, logged)
        c = w2[(w2["tenant"] == tenant) & w2["cacheable"]]
        weekday = c["day"] < 12  # week 2 starts on a Monday: days 12 and 13 are the weekend
        by_kind = {kind: scorer.pick(c.loc[weekday == kind, "norm"].tolist(), k, logged)
                   for kind in (True, False)}  # fmt: skip
        for day in range(7, 14):
            start = WEEK2 + timedelta(days=day - 7)
            plan = sel.plan(
                Window(start, start + timedelta(days=1)), Budget(requests=k), tenants=[tenant]
            )
            warmed = [normalise_prompt(i.item.request.prompt) for i in plan.items]
            b = w2[(w2["tenant"] == tenant) & (w2["day"] == day)]
            asked = b.loc[b["cacheable"], "norm"].tolist()
            best = scorer.pick(asked, k, logged)
            add("total", len(b))
            add("coverage", scorer.served(asked, warmed))
            add("naive", scorer.served(asked, top))
            add("oracle", scorer.oracle(asked, k))
            add("oracle_logged", scorer.served(asked, best))
            add("oracle_rates", scorer.served(asked, by_kind[day < 12]))
            add("history", scorer.served(asked, history))
            for_verified = []
            if verified and vsel is not None:
                vplan = vsel.plan(
                    Window(start, start + timedelta(days=1)), Budget(requests=k), tenants=[tenant]
                )
                for_verified = [normalise_prompt(i.item.request.prompt) for i in vplan.items]
            for level, vs in (verified or {}).items():
                add(f"verified_l{level}_coverage", vs.served(asked, for_verified))
                add(f"verified_l{level}_clustered", vs.served(asked, warmed))
                add(f"verified_l{level}_naive", vs.served(asked, top))
                add(f"verified_l{level}_oracle_logged_choice", vs.served(asked, best))
    total = sums.pop("total")
    return {name: n / total for name, n in sums.items()}


def _norm(p: str) -> str:
    return " ".join(p.lower().split())


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ks", default="50,200,1000")
    ap.add_argument("--threshold", type=float, default=0.5)
    ap.add_argument("--embed-cache", type=Path, default=None, help=".npz reused between runs")
    ap.add_argument(
        "--verified-levels", default="3,7",
        help="ladder levels the verified matcher is held at for the _verified rows; none: no row",
    )  # fmt: skip
    ap.add_argument(
        "--seeds", type=int, default=3, metavar="N",
        help="sample logs: the committed one and N-1 more of the same spec with the next seeds;"
        " each row is the mean over them, with over_seeds (mean, sd, min, max)",
    )  # fmt: skip
    args = ap.parse_args()
    if args.seeds < 1:
        ap.error("--seeds: at least 1")
    emb = DiskCachedEmbedder(shipped_embedder(bulk=True), args.embed_cache)
    rows = SeedRows()
    seeds = list(range(SAMPLE_SEED, SAMPLE_SEED + args.seeds))
    for seed in seeds:
        run_seed(args, load(seed), emb, rows)
    rows.emit(seeds)


def run_seed(
    args: argparse.Namespace, df: pd.DataFrame, emb: DiskCachedEmbedder, rows: SeedRows
) -> None:
    """Every row of one sample log into `rows`."""
    vectors = TextVectors(emb)
    scorer = Scorer(emb)
    # the simulated backend's meaning of each prompt (_verified.py): read by it, not the matcher
    labelled = zip(df["norm"], df["intent"], strict=True)
    meanings = {n: n if i == "oos" else f"label:{i}" for n, i in labelled}
    answers = SimAnswers(emb, meanings)
    verified = {int(x): VerifiedScorer(emb, answers, int(x))
                for x in args.verified_levels.split(",") if x and x != "none"}  # fmt: skip
    with EmbeddedStack(kafka=False) as stack:
        profile = TrafficProfile(build_redis(stack.settings()))
        fill_profile(profile, df[df["day"] < 7])
        for thr, suffix in ((args.threshold, ""), (0.92, "_t092_intents"), (0.92, "_t092")):
            sel = HotSetSelector(
                profile,
                vectors,
                policy=CachePolicy(),
                config=HotSetConfig(
                    cluster_threshold=thr, min_value_ms=None, matcher="static", value_model="hits"
                ),
            )
            for k in (int(x) for x in args.ks.split(",")):
                t0 = time.perf_counter()
                if suffix == "_t092":
                    vsel = HotSetSelector(
                        profile, vectors, policy=CachePolicy(),
                        config=HotSetConfig(matcher="verified", min_value_ms=None, value_model="hits"),
                    )  # fmt: skip
                    f = run_served(sel, df, k, scorer, verified, vsel)
                    emb.save()
                    _add_served(rows, k, f, time.perf_counter() - t0, sorted(verified))
                    continue
                cov, orc, nai = run(sel, df, k)
                emb.save()
                rows.add(
                    f"hot_set_k{k}{suffix}", k=k, cluster_threshold=thr, protocol="per-day",
                    settings=f"{STUDY}, matcher=static, cluster_threshold={thr}",
                    scored="intent labels", coverage=round(cov, 4), oracle=round(orc, 4),
                    naive=round(nai, 4), ratio=round(cov / orc, 4),
                    ratio_vs_naive=round(cov / nai, 4), seconds=round(time.perf_counter() - t0, 1),
                )  # fmt: skip


def _add_served(
    rows: SeedRows, k: int, f: dict[str, float], seconds: float, levels: list[int]
) -> None:
    cov, logged, rates, hist = f["coverage"], f["oracle_logged"], f["oracle_rates"], f["history"]
    rows.add(
        f"hot_set_k{k}_t092", k=k, cluster_threshold=0.92, protocol="per-day",
        settings=f"{STUDY}, matcher=static, cluster_threshold=0.92",
        scored="served at 0.92", coverage=round(cov, 4), oracle=round(f["oracle"], 4),
        naive=round(f["naive"], 4), ratio=round(cov / f["oracle"], 4),
        ratio_vs_naive=round(cov / f["naive"], 4), oracle_logged=round(logged, 4),
        ratio_logged=round(cov / logged, 4),
        # knowing week 2's rates, not the day; week 1's own best K (run_served)
        oracle_rates=round(rates, 4), oracle_rates_ratio_logged=round(rates / logged, 4),
        ratio_vs_rates=round(cov / rates, 4), history=round(hist, 4),
        ratio_vs_history=round(cov / hist, 4), seconds=round(seconds, 1),
    )  # fmt: skip
    for level in levels:
        v = {name: f[f"verified_l{level}_{name}"]
             for name in ("coverage", "clustered", "naive", "oracle_logged_choice")}  # fmt: skip
        rows.add(
            f"hot_set_k{k}_verified_l{level}", k=k, cluster_threshold=0.92, protocol="per-day",
            settings=f"{STUDY}, matcher=verified",
            scored=f"served by the verified matcher held at level {level} (simulated answers)",
            coverage=round(v["coverage"], 4), naive=round(v["naive"], 4),
            ratio_vs_naive=round(v["coverage"] / v["naive"], 4),
            oracle_logged_choice=round(v["oracle_logged_choice"], 4),
            ratio_vs_oracle_logged_choice=round(v["coverage"] / v["oracle_logged_choice"], 4),
            clustered_at_092=round(v["clustered"], 4),
            static_coverage=round(cov, 4), x_static=round(v["coverage"] / cov, 4),
        )  # fmt: skip


if __name__ == "__main__":
    main()
