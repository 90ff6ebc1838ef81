"""`stoker eval-semantic`: served-answer correctness of the static curve and the verified matcher,
on CLINC150 or any labelled CSV, with a real model's answers (the embedded SmolLM2-135M, or any
OpenAI-compatible server) or the simulator's (protocol in evals/semantic.py)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import orjson
import typer
from rich.table import Table

from caches.matching.options import DEFAULT_MAX_WRONG_HIT_RATE
from evals.data import Pairs
from schemas.errors import UsageError
from stoker.app import app, console, examples

if TYPE_CHECKING:
    from caches.embedders import Embedder
    from evals.answers import BackendAnswers
    from evals.report import Evaluation
    from stoker.settings import StokerSettings


@app.command(
    "eval-semantic",
    short_help="How often semantic hits are right: static threshold vs verified.",
    epilog=examples(
        "stoker eval-semantic   (the embedded real model, a sample: <= 15 min cold)",
        "stoker eval-semantic --backend http://gpu-0:8000/v1 --limit 2000",
        "stoker eval-semantic --candidates   (label-free signals side by side)",
        "stoker eval-semantic --simulated --data mine.csv --label-col intent",
    ),
)
def eval_semantic(
    json_out: Annotated[bool, typer.Option("--json", help="one JSON object per line")] = False,
    backend: Annotated[
        str | None,
        typer.Option(
            help="an OpenAI base URL whose answers to use; default: the embedded model "
            "(make setup), started for the run"
        ),
    ] = None,
    simulated: Annotated[
        bool,
        typer.Option("--simulated", help="the simulated backend's answers (told each intent)"),
    ] = False,
    model: Annotated[
        str | None, typer.Option(help="the model to ask; default: the one the server lists")
    ] = None,
    temperature: Annotated[float, typer.Option(min=0.0, max=2.0, help="of every answer")] = 0.0,
    max_tokens: Annotated[int, typer.Option(min=1, max=4096, help="of every answer")] = 40,
    ask_budget: Annotated[
        float,
        typer.Option(
            min=0.0,
            help="seconds to ask the backend for answers the answer cache lacks; the sample "
            "is cut to what was answered (0: no limit)",
        ),
    ] = 600.0,
    answer_cache: Annotated[
        Path | None,
        typer.Option(help="SQLite file of kept answers; default: under the model cache dir"),
    ] = None,
    data: Annotated[
        Path | None, typer.Option(help="a labelled CSV; default CLINC150 test + oos_test")
    ] = None,
    text_col: Annotated[str, typer.Option(help="the CSV's text column")] = "text",
    label_col: Annotated[str, typer.Option(help="the CSV's label column (scoring only)")] = "label",
    oos_label: Annotated[str, typer.Option(help="the label of out-of-scope rows")] = "oos",
    history: Annotated[
        Path | None,
        typer.Option(
            help="earlier traffic (a CSV with the same columns): the budget's counts carry "
            "over from it; default for CLINC150: val + oos_val"
        ),
    ] = None,
    history_split: Annotated[
        str,
        typer.Option(
            help="with --simulated: CLINC150's earlier traffic, val (3,100 queries) or "
            "train+val (18,200: a busy route's days)"
        ),
    ] = "val",
    history_share: Annotated[
        float,
        typer.Option(
            min=0.0,
            max=0.9,
            help="with --data and no --history: this share of the shuffled "
            "rows is the earlier traffic (not scored)",
        ),
    ] = 0.0,
    cold: Annotated[
        bool, typer.Option("--cold", help="no earlier traffic: the budget starts with no verdict")
    ] = False,
    limit: Annotated[
        int, typer.Option(min=0, help="queries to stream; 0 = all (a real model: 600)")
    ] = 0,
    history_limit: Annotated[
        int,
        typer.Option(
            min=0,
            help="earlier queries: a real model's to answer (0 = 300); --simulated: a cap "
            "(0 = --limit's)",
        ),
    ] = 0,
    seed: Annotated[int, typer.Option(help="shuffle seed of the queries")] = 7,
    max_wrong_rate: Annotated[
        float, typer.Option(min=0.0001, max=0.5, help="the error budget's delta")
    ] = DEFAULT_MAX_WRONG_HIT_RATE,
    only: Annotated[
        str, typer.Option(help="comma-separated configuration names; empty = all")
    ] = "",
    candidates: Annotated[
        bool,
        typer.Option(
            "--candidates",
            help="also measure label-free signals side by side on the real answers (the "
            "model as judge, a re-ask at 0.7, learned thresholds, prompt guards)",
        ),
    ] = False,
    candidates_budget: Annotated[
        float,
        typer.Option(
            min=0.0, help="seconds to ask the backend for the candidates' checks (0: no limit)"
        ),
    ] = 300.0,
) -> None:
    """Stream labelled queries through the semantic cache (Qdrant Edge, all-MiniLM-L6-v2) under
    the static curve and the verified matcher, with a model server's answers (kept on disk, so
    a rerun asks for nothing) or the simulator's. Labels only score; matchers see prompts,
    vectors and the backend's answers."""
    from evals.data import data_name, load_clinc, load_csv, split_history

    _check_split(history_split, simulated, data is not None or history is not None or cold)
    if simulated and (backend or model):
        raise UsageError("--simulated takes no --backend or --model: its answers are its own")
    if candidates and simulated:
        raise UsageError("--candidates measures a real backend's answers: not with --simulated")
    if cold and (history is not None or history_share):
        raise UsageError("--cold takes no --history or --history-share")
    if history is not None and history_share:
        raise UsageError("--history and --history-share both name the earlier traffic: give one")
    if data is None:
        if history_share:
            raise UsageError("--history-share splits --data; CLINC150's earlier traffic is val")
        clinc = load_clinc()  # UsageError (exit 2) with the path when absent or unreadable
        earlier: Pairs | None = [] if cold else None
        rows = None
        if simulated and not cold:
            earlier = _clinc_history(clinc, seed, history_split, history_limit or limit)
    else:
        rows = load_csv(data, text_col, label_col)  # UsageError (exit 2) for a bad file
        rows, earlier = split_history(rows, history_share, seed)
    if history is not None:
        earlier = load_csv(history, text_col, label_col)
    names = [n for n in only.split(",") if n] or None
    if candidates and names and not {"stoker", "static_0.92"} <= set(names):
        raise UsageError("--candidates compares with stoker and static_0.92: --only needs both")
    common: dict[str, Any] = dict(seed=seed, max_wrong_rate=max_wrong_rate, oos_label=oos_label)
    named = "clinc" if data is None else data_name(data)
    if simulated:
        _simulated(json_out, rows, earlier, names, limit, cold, common, named)
        return
    _real(json_out, rows, earlier, names, common, named, _Ask(
        backend, model, temperature, max_tokens, ask_budget, answer_cache,
        limit, history_limit, candidates, candidates_budget or None,
    ))  # fmt: skip


def _check_split(split: str, simulated: bool, other_history: bool) -> None:
    """--history-split names CLINC150's earlier traffic, for --simulated alone."""
    from evals.data import history_keys

    history_keys(split)  # UsageError (exit 2) naming the choices
    if split != "val" and not simulated:
        raise UsageError(
            "--history-split is for --simulated: a real model answers --history-limit of val"
        )
    if split != "val" and other_history:
        raise UsageError("--history-split picks CLINC150's earlier traffic: not with "
                         "--data, --history or --cold")  # fmt: skip


def _clinc_history(clinc: dict[str, Pairs], seed: int, split: str, cap: int) -> Pairs:
    """CLINC150's earlier traffic for --simulated: `split`, cut to `cap` queries (0: all)."""
    from evals.data import history_stream

    return history_stream(clinc, seed, split)[: cap or None]


class _Ask:
    def __init__(
        self,
        backend: str | None,
        model: str | None,
        temperature: float,
        max_tokens: int,
        budget_s: float,
        cache: Path | None,
        limit: int,
        history: int,
        candidates: bool = False,
        candidates_budget_s: float | None = None,  # None: no limit
    ) -> None:
        self.candidates, self.candidates_budget_s = candidates, candidates_budget_s
        self.backend, self.model = backend, model
        self.temperature, self.max_tokens = temperature, max_tokens
        self.budget_s, self.cache = budget_s, cache
        self.limit, self.history = limit, history


def _real(
    json_out: bool,
    rows: Pairs | None,
    earlier: Pairs | None,
    names: list[str] | None,
    common: dict[str, Any],
    named: str,
    ask: _Ask,
) -> None:
    from evals.answers import AnswerCache, AskParams, default_cache_path
    from evals.real import (
        HISTORY,
        LIMIT,
        REAL_NAMES,
        Sample,
        backend_answers,
        evaluate_real,
        report_fields,
        sample,
    )
    from schemas.baseurl import BaseURL
    from stoker import modelserver
    from stoker.settings import StokerSettings

    if ask.backend is not None:
        BaseURL.parse(ask.backend)  # ConfigError (exit 2) for a malformed URL
    limit, hist_n = ask.limit or LIMIT, ask.history or HISTORY
    if rows is None:
        s = sample(common["seed"], limit, 0 if earlier == [] else hist_n)
    else:
        s = Sample(rows[:limit], (earlier or [])[:hist_n])
    settings = StokerSettings()
    path = ask.cache or default_cache_path(modelserver.cache_root(settings.model_cache_dir))

    def params(m: str) -> AskParams:
        return AskParams(m, max_tokens=ask.max_tokens, temperature=ask.temperature)

    cache = AnswerCache(path)
    side = None
    try:
        with (
            backend_answers(ask.backend, ask.model, params, cache, s, console.print) as answers,
            console.status("evaluating") as status,
        ):
            embedder = _embedder(settings)
            ev, report, got = evaluate_real(
                embedder, answers, s, seed=common["seed"],
                budget_s=ask.budget_s or None, max_wrong_rate=common["max_wrong_rate"],
                names=names or REAL_NAMES, progress=lambda m: status.update(m),
            )  # fmt: skip
            ev.data = named
            if ask.candidates:
                side = _candidates(ev, answers, embedder, ask, common["seed"], status.update)
    finally:
        cache.close()
    console.print(f"{report.line()} (kept in {path})", soft_wrap=True)
    rows_out = [r.as_dict() for r in ev.rows]
    summary = None
    if {"stoker", "static_0.92"} <= {r.name for r in ev.rows}:
        summary = ev.real_summary(report_fields(report, s, got))
    if json_out:
        for line in [*rows_out, *([summary] if summary else []), *([side] if side else [])]:
            typer.echo(orjson.dumps(line).decode())
        return
    _table(rows_out, ev.answers_from)
    if summary:
        console.print(
            f"{summary['queries']} queries after {summary['history_queries']} earlier ones "
            f"(answers: {summary['answers_from']}); the backend's answers {summary['answers']}"
            f" (the answer checks)",
            soft_wrap=True,
        )
        _headline(summary, ev.embed_seconds)
    if side:
        _candidates_table(side)


def _embedder(s: StokerSettings) -> Embedder:
    """The settings' local embedder (model, threads, engine), as the gateway runs it: the
    answer bar and the thresholds this eval calibrates are the served embedder's."""
    from caches.embedders import EmbedderOptions, SentenceTransformerEmbedder
    from stoker.modelserver import cache_root

    return SentenceTransformerEmbedder.from_options(
        s.options(EmbedderOptions), cache_root(s.model_cache_dir)
    )


def _candidates(
    ev: Evaluation,
    answers: BackendAnswers,
    embedder: Embedder,
    ask: _Ask,
    seed: int,
    progress: Callable[[str], None],
) -> dict[str, Any]:
    from evals.candidates import Candidates, measure
    from evals.semantic import MONITOR_SHARE

    c = Candidates(ev, answers, embedder, budget_s=ask.candidates_budget_s, progress=progress)
    return measure(c, seed, MONITOR_SHARE)


def _candidates_table(side: dict[str, Any]) -> None:
    t = Table(title=f"label-free candidates (answers: {side['answers_from']})")
    cols = ("candidate", "rule", "hits", "wrong (95% bound)", "x static 0.92", "calls",
            "server s", "all 5,500")  # fmt: skip
    for col in cols:
        t.add_column(col, justify="left" if col in ("candidate", "rule") else "right")
    for r in side["candidates"]:
        full = f"{r['full_ratio']:.2f}x, {r['full_wrong_share']:.2%}" if "full_hits" in r else ""
        t.add_row(
            r["name"], r["rule"], str(r["hits"]),
            f"{r['wrong_share']:.2%} ({r['wrong_bound']:.1%})", f"{r['ratio']:.2f}",
            str(r["extra_calls"]), f"{r['extra_server_s']:.0f}", full,
        )  # fmt: skip
    console.print(t)
    console.print(
        f"most hits at <= 1% wrong on this sample: {side['best']} ({side['best_ratio']}x "
        f"static 0.92); of those no worse than static 0.92 on all 5,500 queries where that "
        f"was measured: {side['best_at_scale']} ({side['best_at_scale_ratio']}x); goal 2x "
        f"{'met' if side['goal_met_at_scale'] else 'not met'}; the candidates asked the "
        f"backend for {side['candidates_asked']} answers in {side['candidates_asked_s']:.0f} s",
        soft_wrap=True,
    )


def _simulated(
    json_out: bool,
    rows: Pairs | None,
    earlier: Pairs | None,
    names: list[str] | None,
    limit: int,
    cold: bool,
    common: dict[str, Any],
    named: str,
) -> None:
    from evals.semantic import evaluate
    from stoker.settings import StokerSettings

    with console.status("evaluating") as status:
        ev = evaluate(
            _embedder(StokerSettings()), limit=limit or None, names=names, rows=rows,
            history=earlier, progress=lambda m: status.update(m), **common,
        )  # fmt: skip
    ev.data = named
    rows_out = [r.as_dict() for r in ev.rows]
    summary = ev.summary() if {"stoker", "static_0.92"} <= {r.name for r in ev.rows} else None
    young = ev.cold_summary() if summary and (cold or summary["history_queries"]) else None
    if json_out:
        for line in [*rows_out, *([summary] if summary else []), *([young] if young else [])]:
            typer.echo(orjson.dumps(line).decode())
        return
    _table(rows_out, ev.answers_from)
    if young:
        console.print(
            f"started cold, first {young['queries']} queries: {young['hits']} hits "
            f"({young['hit_rate']:.1%}) at {young['wrong_share']:.2%} wrong against static "
            f"0.92's {young['static092_hits']} at {young['static092_wrong_share']:.2%} "
            f"({young['ratio']:.2f}x); the prompt-only bound served {young['prompt_only_hits']}"
        )
    if summary:
        if summary["history_queries"]:
            console.print(
                f"budget counts carried over from {summary['history_queries']} earlier queries;"
                f" started cold instead: {summary['cold_ratio']:.2f}x static 0.92's hits at "
                f"{summary['cold_wrong_share']:.2%} wrong"
            )
        _headline(summary, ev.embed_seconds)


def _headline(summary: dict[str, Any], embed_s: float) -> None:
    monitor = (
        f"monitor bound {summary['monitor_bound']:.2%} (true {summary['true_wrong']:.2%})"
        if summary["monitor_bound"] is not None
        else "monitor bound not informative: it judges by answers that do not separate"
    )
    console.print(
        f"verified: {summary['ratio']:.2f}x the hit rate of static 0.92, wrong share "
        f"{summary['wrong_share']:.2%} vs {summary['static092_wrong_share']:.2%}; {monitor}; the "
        f"matcher's decision p50 {summary['verification_ms_p50']:.2f} ms, "
        f"p99 {summary['verification_ms_p99']:.2f} ms; embedding {embed_s:.0f} s",
        soft_wrap=True,
    )


def _table(rows: list[dict[str, Any]], answers_from: str) -> None:
    t = Table(title=f"semantic cache: hit rate and wrong share (answers: {answers_from})")
    for col in ("configuration", "hit rate", "wrong share", "oos hit rate", "ceiling", "guarded"):
        t.add_column(col, justify="left" if col == "configuration" else "right")
    for r in rows:
        t.add_row(
            r["name"],
            f"{r['hit_rate']:.1%}",
            f"{r['wrong_share']:.2%}",
            f"{r['oos_hit_rate']:.1%}",
            f"{r['ceiling']:.1%}",
            str(sum(r.get("rejected_by_guard", {}).values())),
        )
    console.print(t)
