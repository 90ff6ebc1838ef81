"""Served-answer correctness on CLINC150: the static-threshold curve and the verified matcher
under its error budget, same run, with the simulator's answers and with a real model's.

Protocol in evals/semantic.py (test + oos_test shuffled, streamed through a Qdrant Edge
store, misses stored with their answers, labels only score).

Simulated rows (answers="simulated: ..."): the simulated backend knows which queries share a
meaning (a perfect-understanding model); the figures depend on it. Figures per configuration:
hit_rate, wrong_share, oos_hit_rate, ceiling; ratio = hit rate / static 0.92's hit rate,
meaningful only when the wrong share is not above static 0.92's (`wrong_share_ok`).
semantic_quality_clinc_cold_first500: the verified matcher started with no earlier verdicts,
over the stream's first 500 queries (a young cache: its cold start), beside static 0.92 over
the same; goal hits >= static 0.92's at <= 1% wrong. prompt_only_hits is the cold rule's prompt
half alone, which no simulated answer enters.

semantic_quality_clinc_long_history (simulated): the same stream after CLINC150's train + val as
earlier traffic (18,200 queries, a busy route's days; `stoker eval-semantic --simulated
--history-split train+val`) instead of val's 3,100, beside static 0.92 in the same run. The
budget weighs an audit of a served hit 1 and a shadow check of a near miss 1/5 (bounds.py), so a
level opens only on ~299 clean audits of the hits it would serve (1% budget); the row says how
many audits and shadow checks the earlier traffic gave the level it left the stream at
(`start_*`) and the level the stream ended at (`final_*`). --long-history caps the earlier
traffic (-1: skip the row).

semantic_quality_clinc_real: the same protocol on a real model's answers (the embedded
SmolLM2-135M-Instruct on llama-server, or --backend), temperature 0: 600 queries after 300 of
earlier traffic, cut to what the server answered within --ask-budget seconds (answers kept on
disk under the model cache dir, so a second run asks nothing: a cold run of this part stays
within ~15 min on this 2-core machine). Beside static 0.92 in the same run; `candidates` holds
every configuration's hits and wrong share (the static curve, the prompt-only rules, the
verified matcher as shipped and as it was before its answer checks); goal 2x static 0.92's
hits at <= 1% wrong, and never fewer hits than static 0.92 at a wrong share no worse.

semantic_candidates_real: on the same answers and stream, label-free signals side by side
(evals/candidates.py): the shipped matcher; a re-ask at temperature 0.7 judged
against the cached answer; the model asked whether the two requests mean the same; a threshold
per cached entry learned from shadow verdicts; the prompt guards alone at 0.84-0.90 (with their
figures on all 5,500 test queries, which need no backend). Per candidate: hits, wrong share,
ratio to static 0.92, the backend requests its checks need and the server's seconds for them;
each check's yes rate on pairs of one intent and of another (scored by labels after the fact);
and two monitors of the shipped matcher's hits (its answers', the model's word) with their
bounds beside the true wrong share. The checks' answers are kept in the same answer cache
within --candidates-budget seconds (a rerun asks nothing).
"""

from __future__ import annotations

import argparse
import time

from _common import emit, shipped_embedder

from caches.matching.verified import LADDER
from evals.report import BASELINE
from evals.semantic import STATIC_CURVE, coverage, evaluate
from evals.tune import REPORTED_ON, TUNED_ON

SIMULATED = "simulated: told each query's intent"


def simulated(args: argparse.Namespace) -> None:
    names = [f"static_{t:.2f}" for t in STATIC_CURVE] + [
        f"verified_L{k}" for k in range(len(LADDER))
    ]
    ev = evaluate(
        shipped_embedder(bulk=True), seed=args.seed, limit=args.limit or None,
        names=[*names, "stoker"],
    )  # fmt: skip
    base = ev.row(f"static_{BASELINE:.2f}").as_dict()
    for r in ev.rows:
        d = r.as_dict()
        name = d.pop("name")
        emit(
            f"semantic_quality_{name}",
            ratio=d["hit_rate"] / max(base["hit_rate"], 1e-9),
            wrong_share_ok=d["wrong_share"] <= base["wrong_share"],
            answers_from=SIMULATED,
            **d,
        )
    summary = ev.summary()
    emit(
        summary.pop("name"), embed_s=round(ev.embed_seconds, 1), seed=args.seed,
        tuned_on=TUNED_ON, reported_on=REPORTED_ON, **summary,
    )  # fmt: skip
    young = ev.cold_summary()  # the verified matcher started cold, over the first queries
    emit(young.pop("name"), seed=args.seed, tuned_on=TUNED_ON, reported_on=REPORTED_ON, **young)
    if args.coverage_seeds:
        cov = coverage(ev.stream, range(1, args.coverage_seeds + 1), ev.evidence)
        emit(cov.pop("name"), answers_from=SIMULATED, **cov)
    if args.long_history >= 0:
        long_history(args)


def _level_evidence(strata: list[list[int]], level: int, prefix: str) -> dict[str, int]:
    """The verdicts a level weighs: those of every strength >= it (levels nest, budget.py);
    strata per strength are [shadow checks, wrong, audits, wrong]."""
    cells = strata[level:]
    return {
        f"{prefix}_level": level,
        f"{prefix}_audits": sum(c[2] for c in cells),
        f"{prefix}_audits_wrong": sum(c[3] for c in cells),
        f"{prefix}_shadow_checks": sum(c[0] for c in cells),
        f"{prefix}_shadow_wrong": sum(c[1] for c in cells),
    }


def long_history(args: argparse.Namespace) -> None:
    from evals.data import history_stream, load_clinc

    t0 = time.perf_counter()
    earlier = history_stream(load_clinc(), args.seed, "train+val")[: args.long_history or None]
    ev = evaluate(
        shipped_embedder(bulk=True), seed=args.seed, limit=args.limit or None,
        names=[f"static_{BASELINE:.2f}", "stoker"], history=earlier,
    )  # fmt: skip
    s = ev.summary()
    ours, base = ev.row("stoker").as_dict(), ev.row(f"static_{BASELINE:.2f}").as_dict()
    hist = ev.row("history").as_dict()
    emit(
        "semantic_quality_clinc_long_history",
        backend="simulated", answers_from=SIMULATED, history_split="train+val", seed=args.seed,
        tuned_on=TUNED_ON, reported_on=REPORTED_ON,
        history_queries=s["history_queries"], queries=s["queries"],
        hits=ours["hits"], hit_rate=s["hit_rate"], wrong_share=s["wrong_share"],
        static092_hits=base["hits"], static092_hit_rate=s["static092_hit_rate"],
        static092_wrong_share=s["static092_wrong_share"], ratio=s["ratio"],
        wrong_share_ok=s["wrong_share"] <= s["static092_wrong_share"],
        monitor_bound=s["monitor_bound"], true_wrong=s["true_wrong"],
        bound_covers=s["bound_covers"],
        # what the earlier traffic alone gave the level it left the stream at, and the
        # stream's own verdicts on top of it at the end
        **_level_evidence(hist["budget_strata"], hist["final_level"], "start"),
        **_level_evidence(ours["budget_strata"], ours["final_level"], "final"),
        budget_levels=ours["budget_levels"], budget_strata=ours["budget_strata"],
        history_budget_strata=hist["budget_strata"],
        cold_ratio=s["cold_ratio"], cold_wrong_share=s["cold_wrong_share"],
        seconds=round(time.perf_counter() - t0, 1),
        goal_ratio_min=2.0, goal_wrong_share_max=0.01,
    )  # fmt: skip


def real(args: argparse.Namespace) -> None:
    from evals.answers import AnswerCache, AskParams, default_cache_path
    from evals.candidates import Candidates, measure
    from evals.real import backend_answers, evaluate_real, report_fields, sample
    from evals.semantic import MONITOR_SHARE
    from stoker import modelserver
    from stoker.settings import StokerSettings

    t0 = time.perf_counter()
    s = sample(args.seed, args.real_limit, args.real_history)
    cache = AnswerCache(
        default_cache_path(modelserver.cache_root(StokerSettings().model_cache_dir))
    )
    side = None
    try:
        with backend_answers(args.backend, None, AskParams, cache, s) as answers:
            embedder = shipped_embedder(bulk=True)
            ev, report, got = evaluate_real(
                embedder, answers, s, seed=args.seed, budget_s=args.ask_budget or None,
            )  # fmt: skip
            t1 = time.perf_counter()
            if args.candidates_budget >= 0:
                c = Candidates(ev, answers, embedder, budget_s=args.candidates_budget or None)
                side = measure(c, args.seed, MONITOR_SHARE)
    finally:
        cache.close()
    out = ev.real_summary(report_fields(report, s, got))
    emit(
        out.pop("name"), seed=args.seed, seconds=round(t1 - t0, 1),
        embed_s=round(ev.embed_seconds, 1), tuned_on=TUNED_ON, reported_on=REPORTED_ON, **out,
    )  # fmt: skip
    if side is not None:
        emit(side.pop("name"), seed=args.seed, seconds=round(time.perf_counter() - t1, 1),
             **side)  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--limit", type=int, default=0, help="simulated: queries; 0 = all 5,500")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--coverage-seeds", type=int, default=5, help="runs of the monitor's bound")
    ap.add_argument(
        "--long-history", type=int, default=0,
        help="simulated: earlier queries of train + val for the long-history row (0: all "
        "18,200; -1: skip the row)",
    )  # fmt: skip
    ap.add_argument("--real-limit", type=int, default=600, help="real model: queries")
    ap.add_argument("--real-history", type=int, default=300, help="real model: earlier queries")
    ap.add_argument(
        "--ask-budget", type=float, default=480.0,
        help="real model: seconds to ask for answers the disk cache lacks (0: no limit)",
    )  # fmt: skip
    ap.add_argument(
        "--candidates-budget", type=float, default=300.0,
        help="real model: seconds to ask for the candidates' checks (0: no limit; -1: skip them)",
    )  # fmt: skip
    ap.add_argument("--backend", help="real model: an OpenAI base URL (default: embedded)")
    ap.add_argument("--only", choices=("simulated", "real"), help="one half only")
    args = ap.parse_args()
    if args.only != "real":
        simulated(args)
    if args.only != "simulated":
        real(args)


if __name__ == "__main__":
    main()
