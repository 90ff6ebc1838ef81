"""The semantic matcher's constants, chosen on CLINC150 val + oos_val (evals/tune.py: the grid
and the rules), never on test, which bench_semantic_quality.py reports.

Prints one line, `semantic_tuning`: what each rule picks on val (`ladder`, `cold_score`,
`prompt_rule_score`, `answer_bar`, `centroid_bar`), the shipped constants beside them, and
`shipped_match` (true when every shipped constant is the val pick). About 15 minutes on this
2-core machine (the embedding of 3,100 queries and their answers, then 90 runs of the stream),
so it is not among `make bench`'s rows: run it when a constant or the matcher changes.
Usage: .venv/bin/python benchmarks/tune_semantic.py [--seed 7] [--limit N]
"""

from __future__ import annotations

import argparse
import sys
import time

from _common import emit, shipped_embedder

from caches.matching.answers import DEFAULT_ANSWER_BAR, DEFAULT_CENTROID_BAR
from caches.matching.cold import DEFAULT_COLD
from caches.matching.fallback import DEFAULT_FALLBACK
from caches.matching.verified import LADDER
from evals.tune import tune, val_stream


def shipped() -> dict[str, object]:
    return {
        "ladder": [[lv.score, lv.agree, lv.margin] for lv in LADDER],
        "cold_score": DEFAULT_COLD.score,
        "prompt_rule_score": DEFAULT_FALLBACK.score,
        "answer_bar": DEFAULT_ANSWER_BAR,
        "centroid_bar": DEFAULT_CENTROID_BAR,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--limit", type=int, default=0, help="the first N val queries (0: all)")
    args = ap.parse_args()
    t0 = time.perf_counter()

    def say(msg: str) -> None:
        print(f"tune: {msg}", file=sys.stderr, flush=True)

    say("embedding CLINC150 val + oos_val and the simulated answers")
    st = val_stream(shipped_embedder(bulk=True), args.seed, args.limit or None)
    picked = tune(st, args.seed, say)
    ship = shipped()
    emit(
        "semantic_tuning", seed=args.seed, **picked,
        shipped={k: ship[k] for k in ship},
        shipped_match=all(ship[k] == picked[k] for k in ship),
        seconds=round(time.perf_counter() - t0, 1),
    )  # fmt: skip


if __name__ == "__main__":
    main()
