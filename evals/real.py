"""eval-semantic on a real model server: a bounded sample of CLINC150, the server's answers
asked within a time budget (kept on disk: answers.py), then the protocol
(semantic.py) on what was answered.

The sample is the protocol's own queries (test + oos_test, shuffled by the seed) cut to
`limit`, and its earlier traffic (val + oos_val) cut to `history`. Answers are asked for both
lists interleaved in proportion, in order, until the budget runs out; each list is then cut
to its longest prefix whose answers all came, so a cold answer cache gives a shorter run in
the same time and a warm one the whole sample, asking nothing.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from caches.embedders import Embedder
from caches.matching.options import DEFAULT_MAX_WRONG_HIT_RATE
from evals.answers import (
    AnswerCache,
    AskParams,
    AskReport,
    BackendAnswers,
    Endpoint,
    served_model,
)
from evals.data import OOS, Pairs, history_stream, load_clinc, query_stream
from evals.report import Evaluation
from evals.semantic import STATIC_CURVE, TRUSTING, evaluate

# The embedded default's sample: 600 queries after 300 of earlier traffic. Warm, it runs in
# ~2 min; cold, the budget below cuts it (SmolLM2-135M on one loaded core here answered
# ~0.5-0.7 queries a second with two slots).
LIMIT = 600
HISTORY = 300
ASK_BUDGET_S = 600.0


@dataclass(frozen=True)
class Sample:
    stream: Pairs
    history: Pairs


def sample(seed: int, limit: int = LIMIT, history: int = HISTORY) -> Sample:
    data = load_clinc()
    return Sample(query_stream(data, seed, limit), history_stream(data, seed)[:history])


def interleaved(a: Sequence[str], b: Sequence[str]) -> list[str]:
    """a and b merged so that each list's share of any prefix is its share of the whole."""
    tagged = [((i + 1) / len(a), 0, t) for i, t in enumerate(a)]
    tagged += [((i + 1) / len(b), 1, t) for i, t in enumerate(b)]
    return [t for *_, t in sorted(tagged, key=lambda x: (x[0], x[1]))]


def answered_sample(
    answers: BackendAnswers,
    s: Sample,
    budget_s: float | None,
    progress: Callable[[str], None] = lambda _: None,
) -> Sample:
    """`s` cut to what the server answered within `budget_s` (None: no limit)."""
    texts = [t for t, _ in s.stream]
    earlier = [t for t, _ in s.history]
    deadline = None if budget_s is None else time.monotonic() + budget_s
    answers.fetch(interleaved(texts, earlier) if earlier else texts, deadline, progress)
    return Sample(s.stream[: answers.answered(texts)], s.history[: answers.answered(earlier)])


def all_cached(cache: AnswerCache, params: AskParams, s: Sample) -> bool:
    """Every answer `s` needs is on disk: the run asks no server."""
    probe = BackendAnswers(NOT_STARTED, params, cache)
    return all(
        probe.answered(texts) == len(texts)
        for texts in ([t for t, _ in s.stream], [t for t, _ in s.history])
    )


# Where a rerun of the embedded default points its (unused) client: nothing is asked.
NOT_STARTED = "http://127.0.0.1:9/v1"


@contextmanager
def backend_answers(
    backend: str | None,
    model: str | None,
    params: Callable[[str], AskParams],
    cache: AnswerCache,
    s: Sample,
    said: Callable[[str], None] = lambda _: None,
) -> Iterator[BackendAnswers]:
    """The answers of `backend` to `s`; with none, of the embedded model server (llama-server,
    SmolLM2-135M), started only when the answer cache lacks one asked for, so that a rerun
    starts nothing (the server's start alone took ~10 s on this loaded box). `params`: the ask
    parameters for a model name (`model`, else the one the server serves)."""
    if backend is not None:
        yield BackendAnswers(backend, params(model or served_model(backend)), cache)
        return
    from stoker.embedded import installed_llama
    from stoker.settings import StokerSettings

    server = installed_llama(StokerSettings())
    p = params(model or server.opts.alias)
    if all_cached(cache, p, s):
        said(f"every answer is in the answer cache: the embedded model ({p.model}) not started")

    def start() -> str:
        # later checks (eval-semantic --candidates) may still need some: started then
        said("starting the embedded model server (llama-server, SmolLM2-135M) ...")
        server.start()
        return server.base_url

    endpoint = Endpoint(NOT_STARTED, start)
    try:
        yield BackendAnswers(endpoint, p, cache)
    finally:
        server.stop()  # a no-op when never started


# Side by side on real answers: the static curve, the same with the prompt guards (the
# candidates that read no answer), the matcher as shipped and before its answer checks.
REAL_NAMES = (
    *(f"static_{t:.2f}" for t in STATIC_CURVE),
    *(f"guarded_{t:.2f}" for t in STATIC_CURVE if 0.84 <= t <= 0.92),
    "stoker",
    TRUSTING,
)


def evaluate_real(
    embedder: Embedder,
    answers: BackendAnswers,
    s: Sample,
    *,
    seed: int = 7,
    budget_s: float | None = ASK_BUDGET_S,
    max_wrong_rate: float = DEFAULT_MAX_WRONG_HIT_RATE,
    names: Sequence[str] = REAL_NAMES,
    progress: Callable[[str], None] = lambda _: None,
) -> tuple[Evaluation, AskReport, Sample]:
    """The protocol on the server's answers to `s` (cut to what came within the budget)."""
    got = answered_sample(answers, s, budget_s, progress)
    if not got.stream:
        raise ValueError(f"no query was answered within {budget_s} s: {answers.report.line()}")
    p = answers.params
    ev = evaluate(
        embedder, seed=seed, names=list(names), rows=got.stream, history=got.history or [],
        oos_label=OOS, max_wrong_rate=max_wrong_rate, progress=progress, shuffle=False,
        answers=lambda rows: answers.pairs([t for t, _ in rows]),
        answers_from=f"real: {p.model} at temperature {p.temperature:g}, {p.max_tokens} "
        f"tokens at most, no label",
    )  # fmt: skip
    return ev, answers.report, got


def report_fields(report: AskReport, asked: Sample, got: Sample) -> dict[str, Any]:
    return {
        "answers_asked": report.asked,
        "answers_cached": report.cached,
        "answers_seconds": round(report.seconds, 1),
        "answers_server_seconds": round(report.server_s, 1),
        "sample_queries": len(asked.stream),
        "sample_history": len(asked.history),
        "history_queries_answered": len(got.history),
    }
