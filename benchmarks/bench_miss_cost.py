"""What a miss costs on the real model, and what an exact hit costs: README's figures.

`stoker gateway` as it ships on the embedded stack (llama.cpp's llama-server serving
SmolLM2-135M-Instruct at one thread), asked with the `openai` SDK. Each of --questions CLINC150
test utterances (a fixed draw) is asked once (a miss) and then again (an exact hit, when its
answer finished and was stored). A miss's cost is llama-server's own (`timings`: prompt_ms +
predicted_ms, what the request log records as gpu_ms), beside its completion tokens; a hit's is
its wall time at the client. The first request of a run is left out of the misses: the server
is cold then (its cost is `cold_miss_ms`).

--runs repeats the whole (a fresh gateway and model server each time, other questions); the
line gives each figure as the mean over the runs, with `over_runs` (mean, sd, min, max) and
`per_run`.

Line miss_cost_real: miss_ms_p50 (a miss's median cost), miss_tokens_p50 (its completion
tokens), miss_ms_per_token (the median of cost / tokens), hit_ms_p50 / hit_ms_p99, hits (hits
served of the repeats), cold_miss_ms, and the load average before and after.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _common import emit, pct
from bench_gateway import _BANNER, _env, _process
from openai import OpenAI

from backends.client import backend_ms
from evals.semantic import load_clinc

STOKER = [sys.executable, "-m", "stoker.cli"]


def one_run(questions: list[str], max_tokens: int, run: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="stoker-miss-cost-") as state:
        env = _env(STOKER_STATE_DIR=state, STOKER_LOG_LEVEL="WARNING")
        with _process([*STOKER, "gateway", "--port", "0"], env, _BANNER) as url:
            client = OpenAI(base_url=url + "/v1", api_key="unused", timeout=300, max_retries=0)
            model = client.models.list().data[0].id
            tenant = {"x-stoker-tenant": f"miss-cost-{run}"}

            def ask(q: str) -> tuple[Any, float]:
                t0 = time.perf_counter()
                r = client.chat.completions.with_raw_response.create(
                    model=model, messages=[{"role": "user", "content": q}], temperature=0,
                    max_tokens=max_tokens, extra_headers=tenant,
                )  # fmt: skip
                return r, (time.perf_counter() - t0) * 1000

            misses: list[tuple[float, int]] = []
            cold: float | None = None
            for i, q in enumerate(questions):
                raw, _ = ask(q)
                if raw.headers.get("x-stoker-cache") != "miss":
                    raise SystemExit(f"miss_cost_real: question {i} was not a miss")
                body = raw.parse()
                timings = (body.model_extra or {}).get("timings")
                if not isinstance(timings, dict):
                    raise SystemExit("miss_cost_real: the upstream sent no timings (llama-server)")
                cost = backend_ms({}, timings, 0.0)  # the request log's gpu_ms, as it is logged
                tokens = body.usage.completion_tokens if body.usage else 0
                if i == 0:
                    cold = cost
                else:
                    misses.append((cost, tokens))
            hits = []
            for q in questions:
                raw, ms = ask(q)
                if raw.headers.get("x-stoker-cache") == "exact":
                    hits.append(ms / 1000)
    costs = [c for c, _ in misses]
    return {
        "miss_ms_p50": round(statistics.median(costs), 1),
        "miss_tokens_p50": statistics.median(t for _, t in misses),
        "miss_ms_per_token": round(statistics.median(c / max(t, 1) for c, t in misses), 1),
        "hit_ms_p50": round(pct(hits, 50), 2) if hits else None,
        "hit_ms_p99": round(pct(hits, 99), 2) if hits else None,
        "hits": len(hits),
        "repeats": len(questions),
        "cold_miss_ms": round(cold or 0.0, 1),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--questions", type=int, default=12, help="fresh questions a run (>= 3)")
    ap.add_argument(
        "--max-tokens",
        type=int,
        default=256,
        help="each answer's cap (an answer it cuts is not stored: no hit)",
    )
    ap.add_argument("--runs", type=int, default=3, help="whole runs, each on a fresh stack")
    ap.add_argument("--seed", type=int, default=7)
    args = ap.parse_args()
    if args.questions < 3 or args.runs < 1 or args.max_tokens < 1:
        ap.error("--questions >= 3, --runs >= 1, --max-tokens >= 1")
    from demo.seeds import spread

    pool = [t for t, _ in load_clinc()["test"]]
    load_before = os.getloadavg()[0]
    runs = [
        one_run(random.Random(f"{args.seed}-{n}").sample(pool, args.questions), args.max_tokens, n)
        for n in range(args.runs)
    ]
    over = {k: spread([r[k] for r in runs]) for k, v in runs[0].items() if k != "repeats"}
    emit(
        "miss_cost_real", **{k: s["mean"] for k, s in over.items() if s}, repeats=args.questions,
        max_tokens=args.max_tokens, runs=args.runs, over_runs=over, per_run=runs,
        model="the embedded SmolLM2-135M-Instruct (llama-server, one thread)",
        load_avg_1m=[round(load_before, 2), round(os.getloadavg()[0], 2)],
    )  # fmt: skip


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    main()
