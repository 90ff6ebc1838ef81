"""A long-tailed request log of any size from CLINC150's utterances, built column by column.

For `stoker analyze` at log scale (benchmarks/bench_analyze.py, tests): sample_log.py builds a
two-week log row by row (rich in weekly shape, ~1 s per 10k rows); this builds a million rows
in seconds, with the shape that decides what analysis costs and what caching buys:
- 5 tenants of Zipf-ranked volume; each ranks the 150 intents by its own Zipf (s=1.1) and each
  intent's 100 `train` phrasings by Zipf (s=1.0): a head of exact repeats;
- 25% of in-scope requests carry a filler prefix or suffix ("hey ...", "... please"): the
  near-duplicates only a semantic cache serves;
- a long tail: `one_off_share` of requests (default 40%) join two utterances drawn uniformly
  from every split ("<a>, also <b>"): ~17k x 17k pairs, so almost every one is asked once,
  and the distinct prompts to embed grow with the log, as a real service's do;
- 7% of requests sample (temperature > 0) and 1% say no-cache; the questions of a third of the
  help center's topics retrieve its articles (RAG, simulation/logs/articles.py: opaque ids,
  each article cited by every question of its topic);
- time: 7 days, a diurnal curve; gpu_ms from prompt and answer tokens as in sample_log.py.
The `intent` column ("oos" for the one-offs) is a label for scoring only.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from simulation.logs.articles import HelpCenter, help_center
from simulation.logs.sample import DIURNAL, PREFIXES, START, SUFFIXES, load_clinc

NO_CACHE = ',"no_cache":true'
SPLITS = ("train", "val", "test", "oos_train", "oos_val", "oos_test")


@dataclass(frozen=True)
class LongTailSpec:
    rows: int = 1_000_000
    tenants: int = 5
    days: int = 7
    zipf_intents: float = 1.1
    zipf_phrasings: float = 1.0
    variation_share: float = 0.25
    one_off_share: float = 0.40
    sampled_share: float = 0.07
    no_cache_share: float = 0.01
    rag_topic_share: float = 1 / 3
    seed: int = 16


def _zipf(n: int, s: float) -> np.ndarray:
    w: np.ndarray = 1.0 / np.arange(1, n + 1) ** s
    return w / float(w.sum())


def generate(spec: LongTailSpec = LongTailSpec(), data_dir: Path | None = None) -> pd.DataFrame:
    """The log, one row per request in time order; columns as `stoker analyze` reads them."""
    rng = np.random.default_rng(spec.seed)
    train = load_clinc("train", data_dir)
    intents = sorted(train)
    every = sorted({t for s in SPLITS for ts in load_clinc(s, data_dir).values() for t in ts})
    n = spec.rows
    tenant = rng.choice(spec.tenants, size=n, p=_zipf(spec.tenants, 1.0))
    ts = _times(spec, rng, n)
    intent = np.empty(n, dtype=np.int64)
    for t in range(spec.tenants):  # each tenant's own ranking of the intents
        rows = np.flatnonzero(tenant == t)
        order = rng.permutation(len(intents))
        intent[rows] = order[
            rng.choice(len(intents), size=len(rows), p=_zipf(len(intents), spec.zipf_intents))
        ]
    phrasing = rng.choice(100, size=n, p=_zipf(100, spec.zipf_phrasings))
    prompts = [
        train[intents[i]][p % len(train[intents[i]])] for i, p in zip(intent, phrasing, strict=True)
    ]
    vary = rng.random(n) < spec.variation_share
    pre, suf = rng.integers(len(PREFIXES), size=n), rng.integers(len(SUFFIXES), size=n)
    for i in np.flatnonzero(vary).tolist():
        prompts[i] = f"{PREFIXES[pre[i]]}{prompts[i]}{SUFFIXES[suf[i]]}"
    one_off = rng.random(n) < spec.one_off_share
    a, b = rng.integers(len(every), size=n), rng.integers(len(every), size=n)
    for i in np.flatnonzero(one_off).tolist():
        prompts[i] = f"{every[a[i]]}, also {every[b[i]]}"
    second = rng.random(len(intents)) < 0.4
    kb = help_center(intents, np.random.default_rng([spec.seed, 1]), second, spec.rag_topic_share)
    return _frame(spec, rng, ts, tenant, intents, intent, one_off, kb, prompts)


def _times(spec: LongTailSpec, rng: np.random.Generator, n: int) -> np.ndarray:
    hours = rng.choice(
        24 * spec.days, size=n, p=np.tile(DIURNAL, spec.days) / (DIURNAL.sum() * spec.days)
    )
    secs: np.ndarray = np.sort(START.timestamp() + hours * 3600.0 + rng.uniform(0, 3600, n))
    return secs


def _frame(
    spec: LongTailSpec,
    rng: np.random.Generator,
    ts: np.ndarray,
    tenant: np.ndarray,
    intents: list[str],
    intent: np.ndarray,
    one_off: np.ndarray,
    kb: HelpCenter,
    prompts: list[str],
) -> pd.DataFrame:
    n = len(ts)
    u = rng.random(n)
    temperature = np.where(u < spec.sampled_share, np.round(rng.uniform(0.3, 1.0, n), 2), 0.0)
    no_cache = (u >= spec.sampled_share) & (u < spec.sampled_share + spec.no_cache_share)
    params = [
        f'{{"temperature":{t},"max_tokens":512{NO_CACHE if nc else ""}}}'
        for t, nc in zip(temperature.tolist(), no_cache.tolist(), strict=True)
    ]
    docs_of = [kb.docs_json(x) for x in intents]
    docs = [
        "[]" if o else docs_of[i] for i, o in zip(intent.tolist(), one_off.tolist(), strict=True)
    ]
    words = np.fromiter((p.count(" ") + 1 for p in prompts), dtype=np.int64, count=n)
    tokens_in = 150 + np.ceil(words * 1.3).astype(np.int64)
    tokens_out = np.clip(rng.lognormal(4.7, 0.5, n), 8, 1024).astype(np.int64)
    labels = np.asarray(intents, dtype=object)[intent]
    labels[one_off] = "oos"
    return pd.DataFrame(
        {
            "ts": pd.to_datetime(ts, unit="s", utc=True),
            "tenant": np.asarray([f"tenant-{t}" for t in range(spec.tenants)], dtype=object)[
                tenant
            ],
            "model_id": "llama-3-8b",
            "model_version": "2026-11-01",
            "template_version": "t1",
            "prompt": prompts,
            "params": params,
            "context_docs": docs,
            "gpu_ms": np.round(0.15 * tokens_in + 12.0 * tokens_out, 1),
            "intent": labels,
        }
    )
