"""A reproducible two-week request log built from CLINC150's real utterances (fixed seed).

Shape (each knob a field of SampleSpec):
- 3 tenants, each with its own Zipf popularity over the 150 intents (s=1.1): tenants share
  some hot intents and differ in the rest, as real tenants of one gateway do;
- paraphrases: a request picks one of its intent's real `train` utterances, itself Zipf-ranked
  (people reuse a few phrasings), so exact repeats and near-duplicates both occur;
- time: a diurnal curve (night trough, day plateau) times a weekday/weekend factor (0.55);
  a fifth of the intents belong to the weekend regime (x3 on Sat/Sun, x0.6 on weekdays) and every
  intent has a preferred hour, so the hot set moves across the week;
- a long tail: 15% of requests are one-off questions (CLINC's out-of-scope utterances with a
  varying detail appended), which no cache can serve, and 25% of in-scope requests carry small
  wording variations (fillers, politeness) that only a semantic cache matches;
- 8% of requests sample (temperature > 0) and 1% say no-cache: never cacheable;
- RAG: a third of the help center's topics are in its knowledge base, and their questions
  retrieve the topic's main article (4 in 10 one more of the same topic), version 1, by opaque
  id (simulation/logs/articles.py): an article serves many questions, no id names one;
- tokens and GPU cost: prompt = template overhead + words x 1.3; answer ~ lognormal(mean ~120);
  gpu_ms = 0.15 ms per prompt token (prefill) + 12 ms per answer token (decode).
The `intent` column is a label for scoring only; nothing that serves or warms may read it, and
no other column (an id, a text) carries it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from datetime import UTC, date, datetime, time, timedelta
from pathlib import Path

import numpy as np
import orjson
import pandas as pd

from schemas.errors import UsageError
from simulation.logs.articles import HelpCenter, help_center

# The checkout's data/ folder; the shell passes the data_dir setting (stoker/data.py) where set.
DEFAULT_DATA_DIR = Path(__file__).resolve().parents[2] / "data"
START = datetime(2026, 11, 2, tzinfo=UTC)  # a Monday, so day 0..4 are weekdays
MAX_TOKENS = 512  # every request's; a client asking for the warmed answers sends the same

# Relative traffic per hour of day: trough at 03-05, plateau 09-17, evening shoulder.
DIURNAL = np.array(
    [0.25, 0.18, 0.12, 0.10, 0.10, 0.14, 0.30, 0.55, 0.85, 1.00, 1.00, 0.95,
     0.90, 0.95, 1.00, 1.00, 0.95, 0.85, 0.75, 0.70, 0.65, 0.55, 0.45, 0.35]
)  # fmt: skip


@dataclass(frozen=True)
class SampleSpec:
    days: int = 14
    requests_per_day: int = 6_000
    tenants: tuple[str, ...] = ("acme", "globex", "initech")
    zipf_intents: float = 1.1
    zipf_phrasings: float = 1.0
    weekend_factor: float = 0.55
    weekend_intent_share: float = 0.2
    one_off_share: float = 0.15
    variation_share: float = 0.25
    sampled_share: float = 0.08
    no_cache_share: float = 0.01
    rag_topic_share: float = 1 / 3
    second_article_share: float = 0.4
    model_id: str = "llama-3-8b"
    model_version: str = "2026-11-01"
    template_version: str = "t1"
    seed: int = 150
    start: datetime = START  # day 0's midnight, UTC
    api: str | None = None  # the params' `api`, as a gateway logs it (None: as a v1 log, none)


def clinc_path(data_dir: Path | None = None) -> Path:
    root = data_dir or DEFAULT_DATA_DIR
    return root / "clinc150" / "data_full.json"


def read_clinc(path: Path) -> dict[str, list[tuple[str, str]]]:
    """CLINC150's data_full.json: split -> [(text, intent)]. UsageError when the file is missing
    or is not that file (a JSON object of splits, each a list of [text, intent] pairs). The one
    reader: the sample-log generators group it by intent, eval-semantic streams its pairs."""
    if not path.is_file():
        raise UsageError(f"CLINC150 not found at {path}; set STOKER_DATA_DIR")
    try:
        raw = orjson.loads(path.read_bytes())
        return {str(k): [(str(u), str(i)) for u, i in v] for k, v in raw.items()}
    except (OSError, orjson.JSONDecodeError, AttributeError, TypeError, ValueError) as e:
        raise UsageError(f"{path} is not CLINC150's data_full.json: {type(e).__name__}: {e}") from e


def load_clinc(split: str = "train", data_dir: Path | None = None) -> dict[str, list[str]]:
    """intent -> utterances of one split (out-of-scope ones under "oos"); UsageError as
    read_clinc's, or when the split is missing."""
    path = clinc_path(data_dir)
    pairs = read_clinc(path)
    if split not in pairs:
        raise UsageError(f"{path} is not CLINC150's data_full.json: it has no {split!r} split")
    out: dict[str, list[str]] = {}
    for text, intent in pairs[split]:
        out.setdefault(intent, []).append(text)
    return out


PREFIXES = ("", "", "hey ", "please ", "can you tell me ", "quick question: ", "so ")
SUFFIXES = ("", "", " please", " thanks", "?", " asap", " for me")
DETAILS = ("for {n} people", "by friday", "in {n} minutes", "for order {n}", "near zip {n}",
           "this year", "for my trip", "at {n} pm", "for account {n}", "with {n} items")  # fmt: skip


def vary(text: str, rng: np.random.Generator) -> str:
    """A small wording change a user might make: only a semantic cache sees it as the same."""
    p, s = PREFIXES[rng.integers(len(PREFIXES))], SUFFIXES[rng.integers(len(SUFFIXES))]
    return f"{p}{text}{s}"


def one_off(pool: list[str], rng: np.random.Generator) -> str:
    detail = DETAILS[rng.integers(len(DETAILS))].format(n=int(rng.integers(2, 9999)))
    return f"{pool[rng.integers(len(pool))]} {detail}"


def _zipf(n: int, s: float) -> np.ndarray:
    w: np.ndarray = 1.0 / np.arange(1, n + 1) ** s
    return w / float(w.sum())


@dataclass(frozen=True)
class _World:
    intents: list[str]
    tenant_weights: np.ndarray  # (tenants, intents): each tenant's Zipf over a permutation
    peak_hour: np.ndarray  # (intents,)
    weekend_intent: np.ndarray  # (intents,) bool
    kb: HelpCenter  # what each intent's questions retrieve


def _world(spec: SampleSpec, intents: list[str], rng: np.random.Generator) -> _World:
    n = len(intents)
    base = _zipf(n, spec.zipf_intents)
    shared = rng.permutation(n)
    weights = np.empty((len(spec.tenants), n))
    for t in range(len(spec.tenants)):
        order = shared.copy()
        # each tenant keeps the shared order for its top 10 and reshuffles the rest partly
        tail = order[10:]
        swap = rng.random(len(tail)) < 0.5
        tail[swap] = rng.permutation(tail[swap])
        weights[t, order] = base
    return _World(
        intents=intents,
        tenant_weights=weights,
        peak_hour=rng.integers(0, 24, n),
        weekend_intent=rng.random(n) < spec.weekend_intent_share,
        # the articles' ids and topics from a generator of their own: the traffic's draws stay
        # those of the seed
        kb=help_center(
            intents, np.random.default_rng([spec.seed, 1]),
            rng.random(n) < spec.second_article_share, spec.rag_topic_share,
        ),
    )  # fmt: skip


def _hour_weights(world: _World, tenant: int, hour: int, weekend: bool) -> np.ndarray:
    w = world.tenant_weights[tenant].copy()
    dist = np.minimum(abs(world.peak_hour - hour), 24 - abs(world.peak_hour - hour))
    w *= 1.0 + 0.8 * np.cos(np.pi * dist / 12.0)  # x1.8 at the peak hour, x0.2 opposite
    w *= np.where(world.weekend_intent, 3.0 if weekend else 0.6, 1.0)
    out: np.ndarray = w / float(w.sum())
    return out


def generate(spec: SampleSpec = SampleSpec(), data_dir: Path | None = None) -> pd.DataFrame:
    """The log as a DataFrame, one row per request, columns as RequestLogged plus `intent`."""
    rng = np.random.default_rng(spec.seed)
    phrasings = load_clinc("train", data_dir)
    # the one-off pool (never a popular intent): train's alone, as for the in-scope questions,
    # so that the val split (which tunes the matcher) and test (which reports it) stay unseen
    phrasings["oos"] = load_clinc("oos_train", data_dir)["oos"]
    intents = sorted(i for i in phrasings if i != "oos")
    world = _world(spec, intents, rng)
    per_hour = spec.requests_per_day / DIURNAL.sum()
    rows: list[dict[str, object]] = []
    for day in range(spec.days):
        weekend = (spec.start + timedelta(days=day)).weekday() >= 5
        for hour in range(24):
            lam = per_hour * DIURNAL[hour] * (spec.weekend_factor if weekend else 1.0)
            for t, tenant in enumerate(spec.tenants):
                n = int(rng.poisson(lam / len(spec.tenants)))
                if n:
                    p = _hour_weights(world, t, hour, weekend)
                    start = spec.start + timedelta(days=day, hours=hour)
                    rows += _hour_rows(spec, world, phrasings, rng, tenant, start, p, n)
    df = pd.DataFrame(rows).sort_values("ts", kind="stable").reset_index(drop=True)
    df["request_id"] = [f"req-{i:07d}" for i in range(len(df))]
    return df


def _hour_rows(
    spec: SampleSpec,
    world: _World,
    phrasings: dict[str, list[str]],
    rng: np.random.Generator,
    tenant: str,
    start: datetime,
    p: np.ndarray,
    n: int,
) -> list[dict[str, object]]:
    out: list[dict[str, object]] = []
    picks = rng.choice(len(world.intents), size=n, p=p)
    seconds = np.sort(rng.uniform(0, 3600, n))
    for i, s in zip(picks, seconds, strict=True):
        intent = world.intents[i]
        if rng.random() < spec.one_off_share:
            intent, text = "oos", one_off(phrasings["oos"], rng)
        else:
            options = phrasings[intent]
            text = options[
                int(rng.choice(len(options), p=_zipf(len(options), spec.zipf_phrasings)))
            ]
            if rng.random() < spec.variation_share:
                text = vary(text, rng)
        u = rng.random()
        temperature = round(float(rng.uniform(0.3, 1.0)), 2) if u < spec.sampled_share else 0.0
        no_cache = spec.sampled_share <= u < spec.sampled_share + spec.no_cache_share
        tokens_in = 150 + math.ceil(len(text.split()) * 1.3)
        tokens_out = int(np.clip(rng.lognormal(4.7, 0.5), 8, 1024))
        gpu_ms = round(0.15 * tokens_in + 12.0 * tokens_out, 1)
        out.append(
            {
                "ts": start + timedelta(seconds=float(s)),
                "tenant": tenant,
                "model_id": spec.model_id,
                "model_version": spec.model_version,
                "template_version": spec.template_version,
                "prompt": text,
                "params": _params_json(temperature, bool(no_cache), spec.api),
                "context_docs": world.kb.docs_json(intent),
                "cache_outcome": "miss",
                "latency_ms": round(gpu_ms + 20.0, 1),
                "gpu_ms": gpu_ms,
                "tokens_in": tokens_in,
                "tokens_out": tokens_out,
                "intent": intent,
            }
        )
    return out


def _params_json(temperature: float, no_cache: bool, api: str | None) -> str:
    p: dict[str, object] = {"temperature": temperature, "max_tokens": MAX_TOKENS}
    if api is not None:
        p["api"] = api
    if no_cache:
        p["no_cache"] = True
    return orjson.dumps(p).decode()


def as_gateway_logs(
    spec: SampleSpec, model_id: str, model_version: str, template_version: str, end: date
) -> SampleSpec:
    """The same traffic as `stoker gateway` logs it, so a warm learned from it lands where the
    gateway reads: chat requests to `model_id` (a model the gateway's upstream serves) in
    the version it serves before any deploy, under the template version of a request with no
    system prompt, retrieving no documents (a plain SDK call sends none), the last `spec.days`
    days before `end` (the planner forecasts a window from the days before it)."""
    start = datetime.combine(end, time(), UTC) - timedelta(days=spec.days)
    return replace(
        spec, model_id=model_id, model_version=model_version, template_version=template_version,
        api="chat", rag_topic_share=0.0, start=start,
    )  # fmt: skip


def write(df: pd.DataFrame, path: Path, spec: SampleSpec | None = None) -> Path:
    """Parquet (zstd): ~20x smaller than jsonl for this log, and `stoker replay` reads it. With
    `spec`, the help center's catalog too (articles_path: doc id -> title, what the live demo
    writes each article's text from)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    df.to_parquet(path, compression="zstd", index=False)
    if spec is not None:
        catalog = help_center(
            [], np.random.default_rng([spec.seed, 1]), np.zeros(0, bool), spec.rag_topic_share
        ).catalog()
        articles_path(path).write_bytes(orjson.dumps(catalog, option=orjson.OPT_INDENT_2))
    return path


def articles_path(log: Path) -> Path:
    """Where a log's help-center catalog sits: beside it, `<stem>.articles.json`."""
    return log.with_name(f"{log.stem}.articles.json")
