"""The served-answer correctness protocol (issue 15): any labelled data set, streamed through
the semantic store and matcher that production uses, with a backend's answers: the simulated
backend's, or a real model server's (evals/answers.py).

Protocol, per configuration (one fresh Qdrant Edge store each):
1. the queries (default: CLINC150 test + oos_test), shuffled with a fixed seed, are embedded in
   one batch, with two answers of the backend to each (the live answer a miss gets, and the
   monitor's re-ask of a hit), both embedded as production embeds answers;
2. each query searches the store as CacheClient._semantic_lookup does (entries only for a
   static threshold; entries and probes with their answer vectors for the verified matcher);
3. a hit is wrong when the cached prompt has another label (out-of-scope queries are wrong
   whenever they hit); a miss stores the query with its live answer's vector, as a live cache
   stores what it computed; so the bank is exactly the stream's earlier misses plus probes;
4. verified only: at `monitor_share`, a hit is audited (audits/judge.py: re-asked, judged by
   meaning, a probe left in the store, a verdict for the error budget) and a miss that nearly
   hit is shadow-checked (its live answer judged against the candidate's); each stored miss
   and each audit of a near look-alike feeds the answer checks (caches/matching/calibration.py)
   that decide whether the answers may vouch at all, else the prompt-only rule serves; the
   budget picks the serving level per query from those verdicts alone;
5. labels are read only by the Scorer (score.py), after the decision.

Earlier traffic. A service's error budget keeps its verdicts for a week (in Redis, per tenant and
route), so a cache that starts empty (a deploy, a purge) still serves at the level last week's
evidence allows. The protocol does the same: the verified matcher first serves the earlier
traffic (default: CLINC150 val + oos_val, utterances the stream never repeats) through a store of
its own, and only the budget's counts (verdicts and answer checks) carry over; the stream then
starts on an empty store. The same matcher with no earlier evidence is reported beside it
(`stoker_cold`). Shadow checks and monitor audits run at the production defaults
(STOKER_BUDGET_SHADOW_SHARE, STOKER_MONITOR_SHARE).

The simulated backend is told which queries share a meaning (the label; each oos query is its
own meaning), as a model that understands every question perfectly would answer them, and words
each answer anew: its figures depend on that convenience, and its rows say so. A real backend
(`--backend`, or the embedded SmolLM2-135M) is told nothing but the prompt.
"""

from __future__ import annotations

import random
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from audits.judge import Auditor, ServedHit
from caches.embedders import Embedder
from caches.keys import Namespace
from caches.matching.answers import AnswerJudge
from caches.matching.base import Accepted, Candidate, Matcher, Query, StaticThreshold, Vector
from caches.matching.bounds import Shares
from caches.matching.calibration import AnswerChecks, AnswerSignal, signal_of
from caches.matching.cold import DEFAULT_COLD, ColdRule
from caches.matching.error_budget import (
    ErrorBudget,
    MemoryCounts,
    choose_level,
    cold_open,
    upper_bound,
)
from caches.matching.fallback import DEFAULT_FALLBACK, PromptRule
from caches.matching.guards import Guarded
from caches.matching.options import DEFAULT_MAX_WRONG_HIT_RATE
from caches.matching.verified import LADDER, Level, VerifiedMatcher, strength_of
from caches.semantic.base import SemanticMatch, SemanticPoint, SemanticQuery
from caches.semantic.edge import EdgeSemanticStore
from evals.data import (
    OOS,
    Pairs,
    Stream,
    history_stream,
    load_clinc,
    load_csv,
    query_stream,
    split_history,
)
from evals.report import BASELINE, PROMPT_ONLY, Evaluation
from evals.score import FIRST, QualityRow, Scorer, percentiles

__all__ = [
    "FIRST",
    "OOS",
    "Evaluation",
    "Pairs",
    "QualityRow",
    "history_stream",
    "load_clinc",
    "load_csv",
    "query_stream",
    "split_history",
]

STATIC_CURVE = (0.80, 0.82, 0.84, 0.86, 0.88, 0.90, 0.92, 0.94, 0.96, 0.98)
_NS = Namespace("eval", "sim-model", "v1", "t1")
_FAR = 10 * 365 * 86_400.0  # entries never expire during a run

# Each query's two answers (live, re-ask) for (text, label) rows; only the simulator reads
# the label.
AnswerSource = Callable[[Pairs], tuple[list[str], list[str]]]


def simulated(oos_label: str = OOS) -> AnswerSource:
    """The simulated backend's two answers to each query, told each query's meaning."""

    def answers(rows: Pairs) -> tuple[list[str], list[str]]:
        from simulation.backend.simulator import SimConfig, Simulator

        meanings = {t: (t if lab == oos_label else f"label:{lab}") for t, lab in rows}
        sim = Simulator(SimConfig(meanings=meanings, vary_wording=True))
        live = [sim.answer_for("sim-model", t, None).text for t, _ in rows]
        again = [sim.answer_for("sim-model", t, None).text for t, _ in rows]
        return live, again

    return answers


def _search(
    store: EdgeSemanticStore, vec: Vector, floor: float, limit: int, answers: bool
) -> list[SemanticMatch]:
    sq = SemanticQuery(vec, _NS, "ctx", "par", floor, time.time(), limit, answers)
    return store.search(sq)


# Told of each miss before it is stored (its index in the stream, the query, what the search
# found): where a rule learns from what a live cache has after a miss (its live answer).
AfterMiss = Callable[[int, Query, list[Candidate]], None]


def run_stream(
    name: str,
    matcher: Matcher,
    st: Stream,
    threshold: float = BASELINE,
    after_miss: AfterMiss | None = None,
) -> QualityRow:
    """Steps 2, 3 and 5 for a matcher that reads no answer vectors (the static curve, prompt
    rules, the candidates of candidates.py)."""
    row = QualityRow(name)
    scorer = Scorer(row, st.labels, st.oos_label)
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
                if after_miss is not None:
                    after_miss(i, q, cands)
                exp = time.time() + _FAR
                store.upsert([SemanticPoint(str(i), vec, _NS, "ctx", "par", exp, text)])
    row.seconds = time.perf_counter() - t0
    row.stats = {**matcher.stats.as_dict(), **percentiles("lookup", lookup_ms)}
    return row


def _default(field: str) -> float:
    from stoker.settings import StokerSettings

    return float(StokerSettings.model_fields[field].default)


MONITOR_SHARE = _default("monitor_share")
SHADOW_SHARE = _default("budget_shadow_share")


@dataclass(frozen=True)
class VerifiedSetup:
    """How run_verified's matcher is built: `fallback` (the prompt-only rule, None: never) and
    `checked` (the answer checks decide whether it serves; False: the answers are trusted
    as the simulator's were, the matcher before calibration)."""

    fallback: PromptRule | None = DEFAULT_FALLBACK
    checked: bool = True
    cold: ColdRule | None = DEFAULT_COLD


def run_verified(
    name: str,
    st: Stream,
    *,
    max_wrong_rate: float = DEFAULT_MAX_WRONG_HIT_RATE,
    monitor_share: float = MONITOR_SHARE,
    shadow_share: float = SHADOW_SHARE,
    seed: int = 0,
    judge: AnswerJudge | None = None,
    fixed_level: int | None = None,
    counts: MemoryCounts | None = None,
    setup: VerifiedSetup = VerifiedSetup(),
    ladder: Sequence[Level] = LADDER,
) -> QualityRow:
    """Steps 2-5 for the verified matcher under an error budget fed by the monitor's audits and
    the shadow checks alone, or held at `fixed_level` of the ladder (the monitor still audits:
    its bound is reported; `ladder`: another ladder, as evals/tune.py tries). `counts`: the
    budget's counts so far (earlier traffic's), counted on. The cold rule opens while the
    budget's evidence allows (budget.cold_open), never with a fixed level; the fallback serves
    while the answer checks do not show the answers separate (never with a fixed level
    either)."""
    judge = judge or AnswerJudge()
    rng = random.Random(seed)
    shares = Shares(audited=monitor_share, shadow=shadow_share)
    budget = ErrorBudget(counts or MemoryCounts(), len(ladder), max_wrong_rate, shares=shares)
    checks = AnswerChecks(budget, lambda a, b: judge.agree(a, b)) if setup.checked else None
    auditor = Auditor(judge, budget, checks=checks)
    state = _State(budget, fixed_level)
    fixed = fixed_level is not None
    matcher = VerifiedMatcher(
        lambda q: state.level, ladder=ladder, bar=judge.bar, cold=None if fixed else setup.cold,
        cold_open=lambda q: state.cold_open, fallback=None if fixed else setup.fallback,
        signal_of=lambda q: state.signal if checks is not None else None, checks=checks,
    )  # fmt: skip
    row = QualityRow(name)
    scorer = Scorer(row, st.labels, st.oos_label)
    audited = _Tally()
    lookup_ms: list[float] = []
    decide_ms: list[float] = []
    at = {t: i for i, t in enumerate(st.texts)} if matcher.needs_vectors else None
    t0 = time.perf_counter()
    with _fresh_store(st.qv.shape[1]) as store:
        for i, (text, vec) in enumerate(zip(st.texts, st.qv, strict=True)):
            q = Query(text, vec, BASELINE, tenant=_NS.tenant)
            t1 = time.perf_counter()
            found = _search(store, vec, matcher.floor_for(q), matcher.limit, True)
            cands = [_candidate(m, st, at) for m in found]
            t2 = time.perf_counter()
            got = matcher.decide(q, cands)
            t3 = time.perf_counter()
            lookup_ms.append((t3 - t1) * 1000)
            decide_ms.append((t3 - t2) * 1000)
            if got is None:
                scorer.record(i, None)
                _shadow_check(matcher, q, cands, st.live_v[i], budget, judge, rng, shadow_share)
                if checks is not None:
                    checks.live(q.tenant, vec, st.live_v[i], matcher.near_answers(q, cands))
                exp = time.time() + _FAR
                store.upsert([SemanticPoint(str(i), vec, _NS, "ctx", "par", exp, text,
                                            answer_vector=st.live_v[i])])  # fmt: skip
            else:
                truly_wrong = scorer.record(i, int(cands[got.index].entry_key))
                if rng.random() < monitor_share:
                    hit = _served(matcher, q, cands, got.index, got.rule, st)
                    _, verdict, probe = auditor.audit(hit, st.again[i], st.again_v[i], time.time())
                    audited.add(not verdict.same, truly_wrong)
                    store.upsert([probe])
            state.read()
    row.seconds = time.perf_counter() - t0
    per = budget.counts.read(_NS.tenant, "", len(ladder))
    row.stats = {
        **matcher.stats.as_dict(),
        "budget_verdicts": sum(c for c, _ in per),
        # (checked, judged wrong) per strength: a level opens only when every pair it would
        # serve holds its bound, so two or three judged wrong among ~600 keep it shut
        "budget_by_strength": [list(c) for c in per],
        # the same by how each was sampled: (shadow checks, wrong, audits, wrong) per strength,
        # and per level what the budget weighed them to (checked', wrong', bound)
        "budget_strata": [list(c) for c in budget.counts.read_strata(_NS.tenant, "", len(ladder))],
        "budget_levels": [
            [round(b.checked, 1), round(b.wrong, 1), round(b.bound, 4)]
            for b in budget.bounds(_NS.tenant, "")
        ],
        **audited.as_dict(state.signal if checks is not None else None),
        "final_level": state.level,
        "final_cold_open": state.cold_open,
        **({} if state.signal is None else _signal_stats(state.signal)),
        **percentiles("lookup", lookup_ms),
        **percentiles("verification", decide_ms),
    }
    return row


def _candidate(m: SemanticMatch, st: Stream, at: dict[str, int] | None) -> Candidate:
    """A search result as the client builds it; `at` (prompt -> query index): the prompt
    vectors, for a matcher that needs them (entries and probes are the stream's prompts)."""
    vec = None if at is None else st.qv[at[m.prompt]]
    return Candidate(m.entry_key, m.prompt, m.score, vec, m.answer_vector, m.kind)


def _served(
    matcher: VerifiedMatcher, q: Query, cands: list[Candidate], index: int, rule: str, st: Stream
) -> ServedHit:
    """What the monitor checks a hit against: the evidence it was served on (a cold or
    fallback hit: its own answer, the pair bar)."""
    c = cands[index]
    j = int(c.entry_key)
    ref, members = st.live_v[j], 1
    a = matcher.assess(q, cands)
    if a.index == index and a.reference is not None and strength_of(rule) is not None:
        ref, members = a.reference, a.members
    return ServedHit(
        _NS, "", "ctx", "par", q.prompt, q.vector, c.entry_key, c.score, rule,
        strength_of(rule), st.live[j], ref, members,
    )  # fmt: skip


def _signal_stats(sig: AnswerSignal) -> dict[str, Any]:
    return {"answers": sig.state, **{f"answers_{k}": v for k, v in sig.rates().items()}}


class _State:
    """The serving level, whether the cold rule is open, and the answer checks, read from the
    budget after each query (what ServingLevels reads from Redis, with no refresh delay)."""

    def __init__(self, budget: ErrorBudget, fixed_level: int | None) -> None:
        self.budget, self.fixed = budget, fixed_level
        self.signal: AnswerSignal | None = None
        self.read()

    def read(self) -> None:
        ev = self.budget.evidence(_NS.tenant, "")
        self.level = (
            choose_level(ev.ladder, self.budget.delta) if self.fixed is None else self.fixed
        )
        self.cold_open = cold_open(ev, self.budget.delta)
        self.signal = signal_of(ev)


@dataclass
class _Tally:
    checked: int = 0
    judged_wrong: int = 0
    truly_wrong: int = 0

    def add(self, judged: bool, truly: bool) -> None:
        self.checked += 1
        self.judged_wrong += judged
        self.truly_wrong += truly

    def as_dict(self, signal: AnswerSignal | None) -> dict[str, Any]:
        """The monitor's bound of the served wrong share, or None where it says nothing: the
        monitor judges a hit by the backend's answers, so its bound means something only while
        the answer checks show those answers tell meanings apart (on SmolLM2-135M they found
        them blind, and the bound read 0.58 against a true 0%: wide, not knowing)."""
        bound = upper_bound(self.judged_wrong, self.checked)
        informative = signal is not None and signal.state == "separates"
        out: dict[str, Any] = {
            "monitor_checked": self.checked,
            "monitor_judged_wrong": self.judged_wrong,
            "monitor_truly_wrong": self.truly_wrong,
            "monitor_bound": bound if informative else None,
            "monitor_informative": informative,
        }
        if not informative:
            why = "no answer check ran" if signal is None else signal.describe()
            out["monitor_reason"] = (
                f"the monitor judges hits by the backend's answers, and nothing shows they tell "
                f"meanings apart ({why}): its bound ({bound:.2f}) says nothing"
            )
            out["monitor_answer_bound"] = bound
        return out


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
    if a is not None and a.strength >= 0 and rng.random() < share:
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


def embed_stream(
    embedder: Embedder, rows: Pairs, oos_label: str, answers: AnswerSource | None = None
) -> Stream:
    live, again = (answers or simulated(oos_label))(rows)
    texts = [t for t, _ in rows]
    from caches.keys import normalise_prompt

    # Each distinct text once: at temperature 0 a re-ask is the live answer's text.
    every = [normalise_prompt(t) for t in texts] + live + again
    uniq = list(dict.fromkeys(every))
    at = {t: i for i, t in enumerate(uniq)}
    vecs = embedder.embed(uniq)[[at[t] for t in every]]
    n = len(rows)
    return Stream(
        texts, [lab for _, lab in rows], oos_label,
        vecs[:n], live, vecs[n : 2 * n], again, vecs[2 * n :],
    )  # fmt: skip


# The verified matcher as it was before its answer checks: it trusts answer agreement at the
# configured bar whatever the backend (measured beside the default on real answers).
TRUSTING = "verified_trusting"
# The prompt-only rule alone (fallback.py), never closed.
PROMPT_RULE = "prompt_rule"


def evaluate(
    embedder: Embedder,
    *,
    seed: int = 7,
    limit: int | None = None,
    names: Sequence[str] | None = None,
    rows: Pairs | None = None,
    history: Pairs | None = None,
    oos_label: str = OOS,
    max_wrong_rate: float = DEFAULT_MAX_WRONG_HIT_RATE,
    monitor_share: float = MONITOR_SHARE,
    progress: Callable[[str], None] = lambda _: None,
    answers: AnswerSource | None = None,
    answers_from: str = "simulated: told each query's intent",
    shuffle: bool = True,
) -> Evaluation:
    """Run the protocol: the static curve, then the verified matcher (name "stoker"), its
    budget carrying the counts of `history` (earlier traffic; none: a cold start only), and
    the same started cold ("stoker_cold") when there is a history. `answers`: where the two
    answers to each query come from (default: the simulated backend), `answers_from` says so
    in every summary.

    Default data: CLINC150 test + oos_test, with val + oos_val as the earlier traffic (both cut
    to `limit`). `shuffle`: given rows are shuffled by the seed (False: they are already)."""
    rows, history = _rows(rows, history, seed, limit, shuffle)

    def wants(name: str) -> bool:
        return not names or name in names

    wants_verified = wants("stoker")
    t0 = time.perf_counter()
    progress(f"embedding {len(rows)} queries and their answers")
    st = embed_stream(embedder, rows, oos_label, answers)
    hist = None
    if history and wants_verified:
        progress(f"embedding {len(history)} earlier queries and their answers")
        hist = embed_stream(embedder, history, oos_label, answers)
    embed_s = time.perf_counter() - t0
    out = []
    for t in STATIC_CURVE:
        name = f"static_{t:.2f}"
        if wants(name):
            progress(name)
            out.append(run_stream(name, StaticThreshold(t), st))
        guarded = f"guarded_{t:.2f}"  # with the number/negation/order guards: by name only
        if names and guarded in names:
            progress(guarded)
            out.append(run_stream(guarded, Guarded(StaticThreshold(t)), st))

    def run(name: str, s: Stream, **kw: Any) -> QualityRow:
        return run_verified(
            name, s, max_wrong_rate=max_wrong_rate, seed=seed, monitor_share=monitor_share, **kw
        )

    for k, lvl in enumerate(LADDER):
        name = f"verified_L{k}"
        if names and name in names:  # the ladder's own curve: asked for by name only
            progress(f"{name} ({lvl})")
            out.append(run(name, st, fixed_level=k))
    evidence = None
    if wants_verified:
        evidence = _verified_rows(out, run, st, hist, progress)
    if names and TRUSTING in names:
        progress(f"{TRUSTING} (the matcher before its answer checks)")
        trusting = VerifiedSetup(fallback=None, checked=False)
        counts = None
        if hist is not None:
            counts = MemoryCounts()
            run("history_trusting", hist, counts=counts, setup=trusting)
        out.append(run(TRUSTING, st, counts=counts, setup=trusting))
    return Evaluation(out, embed_s, st, evidence, answers_from)


def _rows(
    rows: Pairs | None, history: Pairs | None, seed: int, limit: int | None, shuffle: bool
) -> tuple[Pairs, Pairs | None]:
    """The stream and its earlier traffic (module docstring: the defaults)."""
    if rows is None:
        data = load_clinc()
        rows = query_stream(data, seed, limit)
        return rows, history_stream(data, seed)[:limit] if history is None else history
    rows = list(rows)
    if shuffle:
        random.Random(seed).shuffle(rows)
    return (rows[:limit] if limit else rows), history


def _verified_rows(
    out: list[QualityRow],
    run: Callable[..., QualityRow],
    st: Stream,
    hist: Stream | None,
    progress: Callable[[str], None],
) -> MemoryCounts | None:
    """The prompt-only rows, then the verified matcher after the earlier traffic ("stoker")
    and started cold ("stoker_cold"); the earlier traffic's counts, if any."""
    progress(PROMPT_ONLY)
    out.append(run_stream(PROMPT_ONLY, Guarded(StaticThreshold(DEFAULT_COLD.score)), st))
    progress(PROMPT_RULE)
    out.append(run_stream(PROMPT_RULE, _RuleMatcher(DEFAULT_FALLBACK), st))
    evidence = None
    if hist is not None:
        progress(f"history: {len(hist.texts)} earlier queries, for the budget's counts")
        evidence = MemoryCounts()
        out.append(run("history", hist, counts=evidence))
    progress("stoker (verified, error budget, answer checks)")
    out.append(run("stoker", st, counts=None if evidence is None else evidence.copy()))
    if evidence is not None:
        progress("stoker_cold (verified, error budget, no earlier counts)")
        out.append(run("stoker_cold", st))
    return evidence


class _RuleMatcher(Matcher):
    """A prompt rule (fallback.py) on its own, never closed: what the fallback serves."""

    name = PROMPT_RULE
    limit = 10

    def __init__(self, rule: PromptRule) -> None:
        super().__init__()
        self.rule = rule
        self.needs_vectors = rule.needs_vectors

    def floor_for(self, q: Query) -> float:
        return min(self.rule.score, 0.55)

    def choose(self, q: Query, cands: Sequence[Candidate]) -> Accepted | None:
        i = self.rule.pick(q, cands)
        return None if i < 0 else Accepted(i, f"prompt:{self.rule}")


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
    from the same earlier counts (`evidence`) when there are some."""
    runs = []
    for s in seeds:
        counts = None if evidence is None else evidence.copy()
        r = run_verified(f"seed_{s}", reordered(st, s), seed=s, counts=counts, **kw).as_dict()
        runs.append({"seed": s, "monitor_bound": r["monitor_bound"], "true_wrong": r["wrong_share"],
                     "hit_rate": r["hit_rate"]})  # fmt: skip
    # a run whose monitor said its bound means nothing (None) covers nothing
    covered = sum(r["monitor_bound"] is not None and r["monitor_bound"] >= r["true_wrong"]
                  for r in runs)  # fmt: skip
    return {"name": "semantic_monitor_coverage", "runs": runs, "covered": covered,
            "share": covered / max(len(runs), 1)}  # fmt: skip
