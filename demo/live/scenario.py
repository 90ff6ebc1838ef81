"""The live demo's scenario: which day of the sample log, scaled down how, and what happens when.

A day of the sample log is ~6,000 requests of three tenants; on this 2-core box the real model
answers a miss in 0.5-5 s, so the demo serves a slice of it: every request of a few intents,
about 1 request in `slice_n`. Sampling every n-th request instead would thin the repeats
n-fold (29% of the day's requests repeat an earlier one of their tenant; of every 40th
request, 2.6%), and slicing by question text keeps no paraphrase of a served question, so a
semantic cache would meet none (one run scored 1 semantic hit). Slicing by intent keeps each
served intent whole: its repeats and its paraphrases arrive within the day, as they do in the
whole log. The intents are taken in the order of a salted hash, each one kept while the slice
stays within a tenth over its share; of `slice_candidates` salts, the slice whose share of
repeated requests is nearest the whole day's is served, and week 1 of the same intents is the
request-log history the profile learns from. The intent is a label: this choice of traffic
reads it, as the scorer does; nothing the gateway or a worker is sent carries it.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from functools import cached_property
from pathlib import Path
from typing import Any

import orjson
import pandas as pd

from caches.keys import normalise_prompt
from simulation.logs.sample import articles_path
from stoker.data import SAMPLE_LOG
from stoker.modelserver import MODEL_ALIAS

OLD_VERSION = "2026-11-01"  # the version the sample log ran
NEW_VERSION = "2026-11-10"  # deployed during the demo's day


@dataclass(frozen=True)
class LiveScenario:
    log: Path = SAMPLE_LOG
    day: int = 8  # days after the log's first (a Monday): the Tuesday of week 2
    slice_n: int = 25  # serve every request of a few intents: ~1 request in slice_n
    slice_candidates: int = 8
    tenants: tuple[str, ...] = ()  # () = every tenant of the log
    kb_change_h: int = 10  # the help center changes two articles at 10:00 ...
    kb_docs: int = 2
    deploy_h: int = 13  # ... and new weights go live at 13:00
    # The scheduler's warm job runs at the top of every served hour (the shipped job, its
    # rule deciding what is due). Its sends cost the real model what a miss costs, so each
    # run's budget (STOKER_WARM_BUDGET_REQUESTS) is small.
    warm_budget: int = 12
    deploy_budget: int = 16  # the deploy's hot-set pre-warm
    deploy_window_h: int = 3  # ... of the first hours after the cutover
    rewarm_budget: int = 4  # the re-warm after the KB change
    # prefixes the prefix warm sends: the tenants' system prompts. The next ones by count are a
    # prompt with the hottest article, as week 1 logged it: after the KB change, its old text
    prefix_top_n: int = 3
    probes: int = 8  # TTFT: the first requests after the deploy, with and without prefix warm
    # Answers: greedy, one line or sentence (demo.live.texts), at most max_tokens.
    max_tokens: int = 48
    stop: tuple[str, ...] = ("\n", ". ")
    concurrency: int = 2  # requests in flight: the server's two slots
    # The probes go one at a time: the day's first requests after a deploy arrive minutes apart
    # (~4 a minute at the whole day's rate), so each meets an idle server; two at once made
    # the second wait for the first's prefill, whatever the warm did.
    probe_concurrency: int = 1
    grace_s: int = 3  # wall seconds before the old version is purged
    short_prompts: bool = False  # the tenants' opening lines alone (the test's run)

    @classmethod
    def tiny(cls) -> LiveScenario:
        """The test's run: two tenants with short prompts, a thin slice, a few probes (a couple
        of minutes). The slice is the thinnest whose changed articles are asked again after
        the KB change, so the stale check has hits to check."""
        return cls(
            slice_n=100, tenants=("acme", "globex"), warm_budget=4,
            deploy_budget=4, rewarm_budget=2, probes=4, prefix_top_n=2, kb_change_h=9,
            deploy_h=12, short_prompts=True,
        )  # fmt: skip

    @cached_property
    def titles(self) -> dict[str, str]:
        """The help center's catalog beside the log (doc id -> title; {} without one)."""
        path = articles_path(self.log)
        return (
            {str(k): str(v) for k, v in orjson.loads(path.read_bytes()).items()}
            if path.is_file()
            else {}
        )

    def params(self, logged: str) -> dict[str, Any]:
        """A row's parameters for the real model: its temperature and no_cache as logged, the
        demo's max_tokens and stop."""
        p = orjson.loads(logged)
        out: dict[str, Any] = {"temperature": p.get("temperature", 0.0)}
        out |= {"max_tokens": self.max_tokens, "stop": list(self.stop)}
        if p.get("no_cache"):
            out["no_cache"] = True
        return out


@dataclass
class LiveTraffic:
    week1: list[dict[str, Any]]  # the profile's history
    day: list[dict[str, Any]]  # served, in time order
    start: datetime  # the day's first instant
    salt: str
    kb_docs: list[str] = field(default_factory=list)  # the articles the KB change edits
    intents: list[str] = field(default_factory=list)  # served (a label: the report's alone)
    full_day_requests: int = 0
    full_day_repeat_share: float = 0.0

    def hour_of(self, row: dict[str, Any]) -> int:
        return int((row["ts"] - self.start).total_seconds() // 3600)

    @property
    def repeat_share(self) -> float:
        return _repeat_share(self.day)


def load_live_traffic(sc: LiveScenario) -> LiveTraffic:
    df = pd.read_parquet(sc.log)
    if sc.tenants:
        df = df[df.tenant.isin(sc.tenants)]
    df = df.assign(q=df.prompt.map(normalise_prompt), model_id=MODEL_ALIAS)
    first = df.ts.min().floor("D")
    start = first + pd.Timedelta(days=sc.day)
    week1 = df[df.ts < first + pd.Timedelta(days=7)]
    day = df[(df.ts >= start) & (df.ts < start + pd.Timedelta(days=1))].sort_values("ts")
    whole = _repeat_share(day.to_dict("records"))
    salt = min(
        (f"s{i}" for i in range(sc.slice_candidates)),
        key=lambda s: abs(_repeat_share(_slice(day, s, sc.slice_n).to_dict("records")) - whole),
    )
    served = _slice(day, salt, sc.slice_n)
    w1 = week1[week1.intent.isin(set(served.intent))]
    docs = w1.context_docs.map(orjson.loads).explode().dropna().map(lambda d: d["doc_id"])
    return LiveTraffic(
        week1=_records(w1),
        day=_records(served),
        intents=sorted(set(served.intent)),
        start=start.to_pydatetime(),
        salt=salt,
        kb_docs=list(docs.value_counts().index[: sc.kb_docs]),
        full_day_requests=len(day),
        full_day_repeat_share=whole,
    )


def doc_ids(row: dict[str, Any]) -> list[str]:
    return [str(d["doc_id"]) for d in orjson.loads(row["context_docs"])]


def _slice(df: pd.DataFrame, salt: str, n: int) -> pd.DataFrame:
    """Every request of the intents taken in `salt`'s hash order, each one that keeps the slice
    within a tenth over 1/n of `df` (none fits: the rarest intent alone)."""
    if n <= 1:
        return df
    counts = df.intent.value_counts()
    order = sorted(counts.index, key=lambda i: hashlib.sha256(f"{salt}|{i}".encode()).digest())
    room, keep, total = 1.1 * len(df) / n, [], 0
    for intent in order:
        if total + counts[intent] <= room:
            keep.append(intent)
            total += int(counts[intent])
    return df[df.intent.isin(keep or [counts.index[-1]])]


def _repeat_share(rows: list[dict[str, Any]]) -> float:
    """Share of requests that ask what an earlier one of the same tenant asked (question and
    articles): the most an exact cache could serve with no warming."""
    if not rows:
        return 0.0
    distinct = {(r["tenant"], r["q"], r["context_docs"]) for r in rows}
    return 1.0 - len(distinct) / len(rows)


def _records(df: pd.DataFrame) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = df.to_dict("records")
    for r in rows:
        r["ts"] = r["ts"].to_pydatetime()
    return rows


def hours_after(start: datetime, h: int) -> datetime:
    return start + timedelta(hours=h)
