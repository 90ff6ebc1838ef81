"""Served-answer correctness on CLINC150: the static-threshold curve and the verified matcher
under its error budget, same run.

Protocol in stoker/semantic_eval.py (test + oos_test shuffled, streamed through a Qdrant Edge
store, misses stored with their simulated answers, labels only score). The simulated backend
knows which queries share a meaning (a perfect-understanding model); the figures depend on it.
Figures per configuration: hit_rate, wrong_share,
oos_hit_rate, ceiling; ratio = hit rate / static 0.92's hit rate, meaningful only when the wrong
share is not above static 0.92's (`wrong_share_ok`).
semantic_quality_clinc_cold_first500: the verified matcher started with no earlier verdicts,
over the stream's first 500 queries (a young cache: its cold start), beside static 0.92 over
the same; goal hits >= static 0.92's at <= 1% wrong. prompt_only_hits is the cold rule's prompt
half alone, which no simulated answer enters.
"""

from __future__ import annotations

import argparse

from _common import emit

from caches.embedders import SentenceTransformerEmbedder
from caches.matching.verified import LADDER
from stoker.semantic_eval import BASELINE, STATIC_CURVE, coverage, evaluate


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--limit", type=int, default=0, help="queries; 0 = all 5,500")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--coverage-seeds", type=int, default=5, help="runs of the monitor's bound")
    args = ap.parse_args()
    names = [f"static_{t:.2f}" for t in STATIC_CURVE] + [
        f"verified_L{k}" for k in range(len(LADDER))
    ]
    ev = evaluate(
        SentenceTransformerEmbedder(), seed=args.seed, limit=args.limit or None,
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
            **d,
        )
    summary = ev.summary()
    emit(summary.pop("name"), embed_s=round(ev.embed_seconds, 1), seed=args.seed, **summary)
    young = ev.cold_summary()  # the verified matcher started cold, over the first queries
    emit(young.pop("name"), seed=args.seed, answers="simulated: told each query's intent", **young)
    if args.coverage_seeds:
        cov = coverage(ev.stream, range(1, args.coverage_seeds + 1), ev.evidence)
        emit(cov.pop("name"), **cov)


if __name__ == "__main__":
    main()
