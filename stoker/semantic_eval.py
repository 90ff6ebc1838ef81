"""The served-answer correctness protocol (issue 15): any labelled data set, streamed through
the semantic store and matcher that production uses, with a simulated backend that answers
like a model.

Protocol, per configuration (one fresh Qdrant Edge store each):
1. the queries (default: CLINC150 test + oos_test), shuffled with a fixed seed, are embedded in
   one batch, with two answers of the simulated backend to each (the live answer a miss gets,
   and the monitor's re-ask of a hit), both embedded as production embeds answers;
2. each query searches the store as CacheClient._semantic_lookup does (entries only for a
   static threshold; entries and probes with their answer vectors for the verified matcher);
3. a hit is wrong when the cached prompt has another label (out-of-scope queries are wrong
   whenever they hit); a miss stores the query with its live answer's vector, as a live cache
   stores what it computed; so the bank is exactly the stream's earlier misses plus probes;
4. verified only: at `monitor_share`, a hit is audited (warmers/monitor.py: re-asked, judged by
   meaning, a probe left in the store, a verdict for the error budget) and a miss that nearly
   hit is shadow-checked (its live answer judged against the candidate's); the budget picks the
   serving level per query from those verdicts alone;
5. labels are read only by `_Scorer`, after the decision.

Earlier traffic. A service's error budget keeps its verdicts for a week (in Redis, per tenant and
route), so a cache that starts empty (a deploy, a purge) still serves at the level last week's
evidence allows. The protocol does the same: the verified matcher first serves the earlier
traffic (default: CLINC150 val + oos_val, utterances the stream never repeats) through a store of
its own, and only the budget's verdict counts carry over; the stream then starts on an empty
store. The same matcher with no earlier evidence is reported beside it (`stoker_cold`): the
budget then starts at the strictest level and must earn every loosening within the stream.
Shadow checks and monitor audits run at the production defaults (STOKER_BUDGET_SHADOW_SHARE,
STOKER_MONITOR_SHARE).

The simulated backend is told which queries share a meaning: the label (each oos query is its
own meaning), as a model that understands every question perfectly would answer them. It words
each answer anew (warmers/backends/phrasing.py), so answer texts never match by identity; how
far apart answer embeddings of different meanings fall is the simulator's convenience, and
every figure from this protocol depends on it. Run it on your own backend's answers to judge.
"""

from __future__ import annotations

import random
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from caches.embedders import Embedder
from caches.keys import Namespace
from caches.matching.answers import AnswerJudge
from caches.matching.base import Candidate, Matcher, Query, StaticThreshold, Vector
from caches.matching.budget import (
    ErrorBudget,
    MemoryCounts,
    choose_level,
    cold_open,
    upper_bound,
)
from caches.matching.cold import DEFAULT_COLD, ColdRule
from caches.matching.guards import Guarded
from caches.matching.verified import LADDER, VerifiedMatcher, strength_of
from caches.semantic.base import SemanticMatch, SemanticPoint, SemanticQuery
from caches.semantic.edge import EdgeSemanticStore
from schemas.errors import UsageError
from stoker.data import CLINC
from warmers.monitor import Auditor, ServedHit

OOS = "oos"
STATIC_CURVE = (0.80, 0.82, 0.84, 0.86, 0.88, 0.90, 0.92, 0.94, 0.96, 0.98)
BASELINE = 0.92  # the static threshold every other figure is compared with (DESIGN.md default)
FIRST = 500  # a young cache: the cold start's figures are over the stream's first queries
# The cold rule's prompt half alone: its cosine and every lexical guard, no answer consulted.
PROMPT_ONLY = f"prompt_only_{DEFAULT_COLD.score:.2f}"
_NS = Namespace("eval", "sim-model", "v1", "t1")
_FAR = 10 * 365 * 86_400.0  # entries never expire during a run

AnswerFn = Callable[[str], str]
Pairs = list[tuple[str, str]]


def load_clinc(path: Path = CLINC) -> dict[str, Pairs]:
    if not path.is_file():
        raise UsageError(f"CLINC150 not found at {path}; set STOKER_DATA_DIR")
    try:
        raw: dict[str, list[list[str]]] = orjson.loads(path.read_bytes())
        return {k: [(u, i) for u, i in v] for k, v in raw.items()}
    except (OSError, orjson.JSONDecodeError, AttributeError, TypeError, ValueError) as e:
        raise UsageError(f"{path} is not CLINC150's data_full.json: {type(e).__name__}: {e}") from e


def query_stream(data: dict[str, Pairs], seed: int, limit: int | None = None) -> Pairs:
    rows = data["test"] + data["oos_test"]
    random.Random(seed).shuffle(rows)
    return rows[:limit] if limit else rows


def history_stream(data: dict[str, Pairs], seed: int) -> Pairs:
    """The earlier traffic of the default protocol: CLINC150's val + oos_val, shuffled."""
    rows = data["val"] + data["oos_val"]
    random.Random(seed).shuffle(rows)
    return rows


def load_csv(path: Path, text_col: str, label_col: str) -> Pairs:
    """(text, label) rows of a labelled CSV; a clear error for a missing file or column."""
    import pandas as pd

    if not path.exists():
        raise UsageError(f"{path}: no such file")
    try:
        df = pd.read_csv(path, dtype=str, keep_default_na=False)
    except (ValueError, OSError) as e:  # pandas' ParserError is a ValueError
        raise UsageError(f"{path}: not a readable CSV ({e})") from e
    missing = [c for c in (text_col, label_col) if c not in df.columns]
    if missing:
        raise UsageError(f"{path}: no column {missing[0]!r} (columns: {', '.join(df.columns)})")
    rows = [(t, lab) for t, lab in zip(df[text_col], df[label_col], strict=True) if t.strip()]
    if not rows:
        raise UsageError(f"{path}: no row with text in column {text_col!r}")
    return rows


def split_history(rows: Pairs, share: float, seed: int) -> tuple[Pairs, Pairs | None]:
    """(stream, earlier traffic): the first `share` of the rows, shuffled by `seed`, become the
    earlier traffic (None when share is 0: a cold start)."""
    if not share:
        return rows, None
    rows = list(rows)
    random.Random(seed ^ 0x5EED).shuffle(rows)
    k = int(len(rows) * share)
    if k == 0 or k == len(rows):
        raise UsageError(f"--history-share {share} leaves no earlier traffic or no stream")
    return rows[k:], rows[:k]


def answer_pairs(rows: Pairs, oos_label: str) -> tuple[list[str], list[str]]:
    """The simulated backend's two answers to each query (live, then a re-ask)."""
    from warmers.backends.simulator import SimConfig, Simulator

    meanings = {t: (t if lab == oos_label else f"label:{lab}") for t, lab in rows}
    sim = Simulator(SimConfig(meanings=meanings, vary_wording=True))
    live = [sim.answer_for("sim-model", t, None).text for t, _ in rows]
    again = [sim.answer_for("sim-model", t, None).text for t, _ in rows]
    return live, again


@dataclass
class QualityRow:
    name: str
    queries: int = 0
    hits: int = 0
    wrong: int = 0
    oos_queries: int = 0
    oos_hits: int = 0
    reachable: int = 0
    seconds: float = 0.0
    stats: dict[str, Any] = field(default_factory=dict)
    first_hits: int = 0  # over the first FIRST queries: a young cache
    first_wrong: int = 0

    def as_dict(self) -> dict[str, Any]:
        first = min(self.queries, FIRST)
        return {
            "name": self.name,
            "hit_rate": self.hits / max(self.queries, 1),
            "wrong_share": self.wrong / max(self.hits, 1),
            f"first{FIRST}_hit_rate": self.first_hits / max(first, 1),
            f"first{FIRST}_wrong_share": self.first_wrong / max(self.first_hits, 1),
            f"first{FIRST}_hits": self.first_hits,
            "oos_hit_rate": self.oos_hits / max(self.oos_queries, 1),
            "ceiling": self.reachable / max(self.queries, 1),
            "queries": self.queries,
            "hits": self.hits,
            "wrong_hits": self.wrong,
            "seconds": round(self.seconds, 2),
            **{k: v for k, v in self.stats.items() if k != "lookups"},
        }


class _Scorer:
    """The only reader of labels, called after each decision."""

    def __init__(self, row: QualityRow, labels: Sequence[str], oos_label: str) -> None:
        self.row = row
        self.labels = labels
        self.oos = oos_label
        self.cached: set[str] = set()

    def record(self, i: int, hit: int | None) -> bool:
        """Tally query i's outcome; True when it was a wrong hit."""
        r, label = self.row, self.labels[i]
        r.queries += 1
        r.oos_queries += label == self.oos
        r.reachable += label != self.oos and label in self.cached
        if hit is None:
            self.cached.add(label)
            return False
        wrong = label == self.oos or self.labels[hit] != label
        r.hits += 1
        r.oos_hits += label == self.oos
        r.wrong += wrong
        if r.queries <= FIRST:
            r.first_hits += 1
            r.first_wrong += wrong
        return wrong


@dataclass(frozen=True)
class Stream:
    """The embedded protocol input: queries, their vectors, the backend's answers to each."""

    texts: list[str]
    labels: list[str]
    oos_label: str
    qv: Vector
    live: list[str]
    live_v: Vector
    again: list[str]
    again_v: Vector


def _search(
    store: EdgeSemanticStore, vec: Vector, floor: float, limit: int, answers: bool
) -> list[SemanticMatch]:
    sq = SemanticQuery(vec, _NS, "ctx", "par", floor, time.time(), limit, answers)
    return store.search(sq)


def run_stream(name: str, matcher: Matcher, st: Stream, threshold: float = BASELINE) -> QualityRow:
    """Steps 2, 3 and 5 for a matcher that reads no answers (the static curve)."""
    row = QualityRow(name)
    scorer = _Scorer(row, st.labels, st.oos_label)
    lookup_ms: list[float] = []
    t0 = time.perf_counter()
    with _fresh_store(st.qv.shape[1]) as store:
        for i, (text, vec) in enumerate(zip(st.texts, st.qv, strict=True)):
            q = Query(text, vec, threshold)
            t1 = time.perf_counter()
            found = _search(store, vec, matcher.floor_for(q), matcher.limit, False)
            cands = [
                Candidate(m.entry_key, m.prompt, m.score, st.qv[int(m.entry_key)]) for m in found
            ]
            got = matcher.decide(q, cands)
            lookup_ms.append((time.perf_counter() - t1) * 1000)
            hit = None if got is None else int(cands[got.index].entry_key)
            scorer.record(i, hit)
            if hit is None:
                exp = time.time() + _FAR
                store.upsert([SemanticPoint(str(i), vec, _NS, "ctx", "par", exp, text)])
    row.seconds = time.perf_counter() - t0
    row.stats = {**matcher.stats.as_dict(), **_percentiles(lookup_ms)}
    return row


def _percentiles(lookup_ms: list[float]) -> dict[str, float]:
    """Search + decision per query (the store's search and the matcher; no embedding)."""
    if not lookup_ms:
        return {"lookup_ms_p50": 0.0, "lookup_ms_p99": 0.0}
    p50, p99 = np.percentile(lookup_ms, [50, 99])
    return {"lookup_ms_p50": float(p50), "lookup_ms_p99": float(p99)}


def _default(field: str) -> float:
    from stoker.settings import StokerSettings

    return float(StokerSettings.model_fields[field].default)


MONITOR_SHARE = _default("monitor_share")
SHADOW_SHARE = _default("budget_shadow_share")


def run_verified(
    name: str,
    st: Stream,
    *,
    max_wrong_rate: float = 0.01,
    monitor_share: float = MONITOR_SHARE,
    shadow_share: float = SHADOW_SHARE,
    seed: int = 0,
    judge: AnswerJudge | None = None,
    fixed_level: int | None = None,
    counts: MemoryCounts | None = None,
    cold: ColdRule | None = DEFAULT_COLD,
) -> QualityRow:
    """Steps 2-5 for the verified matcher under an error budget fed by the monitor's audits and
    the shadow checks alone, or held at `fixed_level` of the ladder (the monitor still audits:
    its bound is reported). `counts`: the verdicts so far (earlier traffic's), counted on.
    `cold`: the cold-start rule, open while the budget's evidence allows (budget.cold_open);
    never with a fixed level."""
    judge = judge or AnswerJudge()
    rng = random.Random(seed)
    budget = ErrorBudget(counts or MemoryCounts(), len(LADDER), max_wrong_rate)
    auditor = Auditor(judge, budget)
    state = _State(budget, fixed_level)
    matcher = VerifiedMatcher(
        lambda q: state.level, bar=judge.bar, cold=None if fixed_level is not None else cold,
        cold_open=lambda q: state.cold_open,
    )  # fmt: skip
    row = QualityRow(name)
    scorer = _Scorer(row, st.labels, st.oos_label)
    audited = _Tally()
    verify_ms: list[float] = []
    t0 = time.perf_counter()
    with _fresh_store(st.qv.shape[1]) as store:
        for i, (text, vec) in enumerate(zip(st.texts, st.qv, strict=True)):
            q = Query(text, vec, BASELINE, tenant=_NS.tenant)
            t1 = time.perf_counter()
            found = _search(store, vec, matcher.floor_for(q), matcher.limit, True)
            cands = [
                Candidate(m.entry_key, m.prompt, m.score, answer=m.answer_vector, kind=m.kind)
                for m in found
            ]
            got = matcher.decide(q, cands)
            verify_ms.append((time.perf_counter() - t1) * 1000)
            if got is None:
                scorer.record(i, None)
                _shadow_check(matcher, q, cands, st.live_v[i], budget, judge, rng, shadow_share)
                exp = time.time() + _FAR
                store.upsert([SemanticPoint(str(i), vec, _NS, "ctx", "par", exp, text,
                                            answer_vector=st.live_v[i])])  # fmt: skip
            else:
                c = cands[got.index]
                j = int(c.entry_key)
                truly_wrong = scorer.record(i, j)
                if rng.random() < monitor_share:
                    a = matcher.assess(q, cands)  # the evidence the hit was served on
                    ref, members = st.live_v[j], 1  # a cold hit: its own answer, the pair bar
                    if a.index == got.index and a.reference is not None:
                        ref, members = a.reference, a.members
                    hit = ServedHit(
                        _NS, "", "ctx", "par", text, vec, c.entry_key, c.score, got.rule,
                        strength_of(got.rule), st.live[j], ref, members,
                    )  # fmt: skip
                    _, verdict, probe = auditor.audit(hit, st.again[i], st.again_v[i], time.time())
                    audited.add(not verdict.same, truly_wrong)
                    store.upsert([probe])
            state.read()
    row.seconds = time.perf_counter() - t0
    per = budget.counts.read(_NS.tenant, "", len(LADDER))
    row.stats = {
        **matcher.stats.as_dict(),
        "budget_verdicts": sum(c for c, _ in per),
        "monitor_checked": audited.checked,
        "monitor_judged_wrong": audited.judged_wrong,
        "monitor_truly_wrong": audited.truly_wrong,
        "monitor_bound": upper_bound(audited.judged_wrong, audited.checked),
        "final_level": state.level,
        "final_cold_open": state.cold_open,
        **_percentiles(verify_ms),
    }
    return row


class _State:
    """The serving level and whether the cold rule is open, read from the budget after each
    query (what ServingLevels reads from Redis, with no refresh delay)."""

    def __init__(self, budget: ErrorBudget, fixed_level: int | None) -> None:
        self.budget, self.fixed = budget, fixed_level
        self.read()

    def read(self) -> None:
        ev = self.budget.evidence(_NS.tenant, "")
        self.level = (
            choose_level(ev.ladder, self.budget.delta) if self.fixed is None else self.fixed
        )
        self.cold_open = cold_open(ev, self.budget.delta)


@dataclass
class _Tally:
    checked: int = 0
    judged_wrong: int = 0
    truly_wrong: int = 0

    def add(self, judged: bool, truly: bool) -> None:
        self.checked += 1
        self.judged_wrong += judged
        self.truly_wrong += truly


def _shadow_check(
    matcher: VerifiedMatcher,
    q: Query,
    cands: list[Candidate],
    live_vec: Vector,
    budget: ErrorBudget,
    judge: AnswerJudge,
    rng: random.Random,
    share: float,
) -> None:
    """As CacheClient does at store time: the near-miss's live answer against its candidate's."""
    a = matcher.shadow_of(q, cands)
    if a is not None and rng.random() < share:
        same = judge.agree(live_vec, a.reference, a.members)
        budget.record(q.tenant, q.route, a.strength, wrong=not same)


class _fresh_store:
    def __init__(self, dim: int) -> None:
        self._tmp = tempfile.TemporaryDirectory(prefix="stoker-eval-")
        self.store = EdgeSemanticStore(Path(self._tmp.name) / "shard", dim)

    def __enter__(self) -> EdgeSemanticStore:
        return self.store

    def __exit__(self, *exc: object) -> None:
        self.store.close()
        self._tmp.cleanup()


@dataclass
class Evaluation:
    rows: list[QualityRow]
    embed_seconds: float
    stream: Stream
    evidence: MemoryCounts | None = None  # the budget's verdicts after the earlier traffic

    def row(self, name: str) -> QualityRow:
        return next(r for r in self.rows if r.name == name)

    def summary(self) -> dict[str, Any]:
        """The issue's headline line: verified beside static 0.92, with the monitor's bound of
        the wrong rate beside the true one."""
        ours = self.row("stoker").as_dict()
        base = self.row(f"static_{BASELINE:.2f}").as_dict()
        names = {r.name for r in self.rows}
        cold = self.row("stoker_cold").as_dict() if "stoker_cold" in names else ours
        history = self.row("history").as_dict() if "history" in names else None
        return {
            "name": "semantic_quality_clinc",
            "hit_rate": ours["hit_rate"],
            "wrong_share": ours["wrong_share"],
            "oos_hit_rate": ours["oos_hit_rate"],
            "ceiling": ours["ceiling"],
            "static092_hit_rate": base["hit_rate"],
            "static092_wrong_share": base["wrong_share"],
            "ratio": ours["hit_rate"] / max(base["hit_rate"], 1e-9),
            "monitor_bound": ours["monitor_bound"],
            "true_wrong": ours["wrong_share"],
            "bound_covers": ours["monitor_bound"] >= ours["wrong_share"],
            # What verification adds to a semantic lookup, against static 0.92 in the same run
            # (a wider search returning answer vectors, and the agreement checks).
            "verification_ms_p50": ours["lookup_ms_p50"] - base["lookup_ms_p50"],
            "verification_ms_p99": ours["lookup_ms_p99"] - base["lookup_ms_p99"],
            "queries": ours["queries"],
            "final_level": ours["final_level"],
            # Earlier traffic's verdicts carried into the stream (0: a cold start), and the same
            # matcher started cold beside it.
            "history_queries": history["queries"] if history else 0,
            "cold_hit_rate": cold["hit_rate"],
            "cold_wrong_share": cold["wrong_share"],
            "cold_ratio": cold["hit_rate"] / max(base["hit_rate"], 1e-9),
            "cold_final_level": cold["final_level"],
        }

    def cold_summary(self) -> dict[str, Any]:
        """A young cache: the verified matcher started with no earlier verdicts, over the
        stream's first FIRST queries, beside static 0.92 and the cold rule's prompt-only bound
        over the same queries."""
        names = {r.name for r in self.rows}
        cold = self.row("stoker_cold" if "stoker_cold" in names else "stoker").as_dict()
        base = self.row(f"static_{BASELINE:.2f}").as_dict()
        bound = self.row(PROMPT_ONLY).as_dict() if PROMPT_ONLY in names else None
        f = f"first{FIRST}"
        return {
            "name": f"semantic_quality_clinc_cold_{f}",
            "queries": min(cold["queries"], FIRST),
            "hits": cold[f"{f}_hits"],
            "hit_rate": cold[f"{f}_hit_rate"],
            "wrong_share": cold[f"{f}_wrong_share"],
            "static092_hits": base[f"{f}_hits"],
            "static092_hit_rate": base[f"{f}_hit_rate"],
            "static092_wrong_share": base[f"{f}_wrong_share"],
            "ratio": cold[f"{f}_hit_rate"] / max(base[f"{f}_hit_rate"], 1e-9),
            # The cold rule served on the prompts alone (no answer vetoes, never closed): what
            # it serves whatever the backend's answers say; no simulated answer enters it.
            "prompt_only_hits": bound[f"{f}_hits"] if bound else None,
            "prompt_only_wrong_share": bound[f"{f}_wrong_share"] if bound else None,
            # The same runs over the whole stream.
            "stream_queries": cold["queries"],
            "stream_hit_rate": cold["hit_rate"],
            "stream_wrong_share": cold["wrong_share"],
            "stream_static092_hit_rate": base["hit_rate"],
            "stream_static092_wrong_share": base["wrong_share"],
            "hits_by_rule": cold["hits_by_rule"],
            "final_level": cold["final_level"],
            "final_cold_open": cold["final_cold_open"],
            "goal_ratio_min": 1.0,
            "goal_wrong_share_max": 0.01,
        }


def embed_stream(embedder: Embedder, rows: Pairs, oos_label: str) -> Stream:
    live, again = answer_pairs(rows, oos_label)
    texts = [t for t, _ in rows]
    from caches.keys import normalise_prompt

    vecs = embedder.embed([normalise_prompt(t) for t in texts] + live + again)
    n = len(rows)
    return Stream(
        texts, [lab for _, lab in rows], oos_label,
        vecs[:n], live, vecs[n : 2 * n], again, vecs[2 * n :],
    )  # fmt: skip


def evaluate(
    embedder: Embedder,
    *,
    seed: int = 7,
    limit: int | None = None,
    names: Sequence[str] | None = None,
    rows: Pairs | None = None,
    history: Pairs | None = None,
    oos_label: str = OOS,
    max_wrong_rate: float = 0.01,
    monitor_share: float = MONITOR_SHARE,
    progress: Callable[[str], None] = lambda _: None,
) -> Evaluation:
    """Run the protocol: the static curve, then the verified matcher (name "stoker"), its
    budget carrying the verdicts of `history` (earlier traffic; none: a cold start only), and
    the same started cold ("stoker_cold") when there is a history.

    Default data: CLINC150 test + oos_test, with val + oos_val as the earlier traffic (both cut
    to `limit`)."""
    if rows is None:
        data = load_clinc()
        rows = query_stream(data, seed, limit)
        history = history_stream(data, seed)[:limit] if history is None else history
    else:
        rows = list(rows)
        random.Random(seed).shuffle(rows)
        rows = rows[:limit] if limit else rows
    wants_verified = not names or "stoker" in names
    t0 = time.perf_counter()
    progress(f"embedding {len(rows)} queries and {2 * len(rows)} simulated answers")
    st = embed_stream(embedder, rows, oos_label)
    hist = None
    if history and wants_verified:
        progress(f"embedding {len(history)} earlier queries and their answers")
        hist = embed_stream(embedder, history, oos_label)
    embed_s = time.perf_counter() - t0
    out = []
    for t in STATIC_CURVE:
        name = f"static_{t:.2f}"
        if not names or name in names:
            progress(name)
            out.append(run_stream(name, StaticThreshold(t), st))
    for k, lvl in enumerate(LADDER):
        name = f"verified_L{k}"
        if names and name in names:  # the ladder's own curve: asked for by name only
            progress(f"{name} ({lvl})")
            out.append(run_verified(name, st, monitor_share=monitor_share, seed=seed,
                                    fixed_level=k))  # fmt: skip
    evidence = None
    if wants_verified:
        progress(PROMPT_ONLY)
        out.append(run_stream(PROMPT_ONLY, Guarded(StaticThreshold(DEFAULT_COLD.score)), st))

        def budgeted(name: str, s: Stream, counts: MemoryCounts | None) -> QualityRow:
            return run_verified(name, s, max_wrong_rate=max_wrong_rate, seed=seed,
                                monitor_share=monitor_share, counts=counts)  # fmt: skip

        if hist is not None:
            progress(f"history: {len(hist.texts)} earlier queries, for the budget's verdicts")
            evidence = MemoryCounts()
            out.append(budgeted("history", hist, evidence))
        progress("stoker (verified, error budget)")
        out.append(budgeted("stoker", st, None if evidence is None else evidence.copy()))
        if evidence is not None:
            progress("stoker_cold (verified, error budget, no earlier verdicts)")
            out.append(budgeted("stoker_cold", st, None))
    return Evaluation(out, embed_s, st, evidence)


def reordered(st: Stream, seed: int) -> Stream:
    """The same embedded queries and answers in another order (another run of the stream)."""
    order = np.random.default_rng(seed).permutation(len(st.texts))
    pick = [int(i) for i in order]
    return Stream(
        [st.texts[i] for i in pick], [st.labels[i] for i in pick], st.oos_label, st.qv[order],
        [st.live[i] for i in pick], st.live_v[order], [st.again[i] for i in pick],
        st.again_v[order],
    )  # fmt: skip


def coverage(
    st: Stream, seeds: Sequence[int], evidence: MemoryCounts | None = None, **kw: Any
) -> dict[str, Any]:
    """Does the monitor's bound cover the true wrong share? One budgeted run per seed, each
    from the same earlier verdicts (`evidence`) when there are some."""
    runs = []
    for s in seeds:
        counts = None if evidence is None else evidence.copy()
        r = run_verified(f"seed_{s}", reordered(st, s), seed=s, counts=counts, **kw).as_dict()
        runs.append({"seed": s, "monitor_bound": r["monitor_bound"], "true_wrong": r["wrong_share"],
                     "hit_rate": r["hit_rate"]})  # fmt: skip
    covered = sum(r["monitor_bound"] >= r["true_wrong"] for r in runs)
    return {"name": "semantic_monitor_coverage", "runs": runs, "covered": covered,
            "share": covered / max(len(runs), 1)}  # fmt: skip
