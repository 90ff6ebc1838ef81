"""`stoker analyze` at log scale: a 1M-row log in <= 10 minutes, estimates within 1 point.

Logs come from simulation/logs/longtail.py (5 tenants, Zipf intents and phrasings, 25% filler
variations, 40% one-off pairs: a 1M-row log has ~490k distinct prompts, ~450k of them asked
once). Each run is the real command, `stoker analyze LOG --json`, a process of its own, with the
embedding cache on a redis-server started here (or --redis-url: a second run then skips the
full computation's embedding):
1. a 100k-row log with --no-sample (every distinct prompt embedded): the full computation;
2. the same 100k-row log with the default budget (its embeddings now cached);
3. the 1M-row log, default embedding budget, --no-embed-cache (cold: nothing from 1-2 helps):
   `seconds` is its wall time (model load, reading and keying the log, embedding the sample,
   the simulations).
hit_rate_error_points = the largest |estimated - full| overall hit rate over every threshold
and TTL of the grid, in points; ci_covers = how many of those cells' 95% intervals hold the
full figure.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import orjson
from _common import ROOT, emit

from simulation.logs.longtail import LongTailSpec, generate
from stoker.embedded import RedisServer

TIMEOUT_S = 1_800


def run(log: Path, redis_url: str, *extra: str) -> tuple[float, dict[str, Any]]:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "STOKER_REDIS_URL": redis_url}
    argv = [sys.executable, "-m", "stoker.cli", "analyze", str(log), "--json", *extra]
    started = time.perf_counter()
    out = subprocess.run(
        argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=TIMEOUT_S, check=False
    )
    took = time.perf_counter() - started
    if out.returncode != 0:
        raise SystemExit(f"analyze failed ({out.returncode}): {out.stderr[-3000:]}")
    return took, orjson.loads(out.stdout)


def grid(report: dict[str, Any]) -> dict[tuple[Any, int], dict[str, Any]]:
    return {(g["threshold"], g["ttl_s"]): g["overall"] for g in report["simulation"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--compare-rows", type=int, default=100_000)
    ap.add_argument("--budget", type=int, default=None, help="default: the settings' budget")
    ap.add_argument("--redis-url", default=None, help="the embedding cache (default: a new one)")
    args = ap.parse_args()
    budget = ["--embed-budget", str(args.budget)] if args.budget else []
    server = None if args.redis_url else RedisServer()
    with tempfile.TemporaryDirectory(prefix="stoker-analyze-") as tmp:
        try:
            if server is not None:
                server.launch()
                server.wait_ready()
            url = args.redis_url or server.url  # type: ignore[union-attr]
            big, small = Path(tmp, "big.parquet"), Path(tmp, "small.parquet")
            generate(LongTailSpec(rows=args.compare_rows, seed=17)).to_parquet(small)
            _, full = run(small, url, "--no-sample")
            _, est = run(small, url, *budget)
            generate(LongTailSpec(rows=args.rows)).to_parquet(big)
            seconds, report = run(big, url, *budget, "--no-embed-cache")
        finally:
            if server is not None:
                server.stop()
    cells_full, cells_est = grid(full), grid(est)
    errors, covers = [], 0
    for at, f in cells_full.items():
        e = cells_est[at]
        errors.append(abs(e["hit_rate_total"] - f["hit_rate_total"]))
        lo, hi = e["hit_rate_total_ci"]
        covers += lo <= f["hit_rate_total"] <= hi
    rec = est["recommendation"]
    emit(
        "analyze_1m",
        seconds=round(seconds, 1),
        hit_rate_error_points=round(100 * max(errors), 3),
        ci_covers=f"{covers}/{len(errors)}",
        rows=args.rows,
        distinct_prompts=report["sample"]["distinct_prompts"],
        embedded_prompts=report["sample"]["embedded_prompts"],
        runtime_s=report["runtime_s"],
        compare_rows=args.compare_rows,
        compare_distinct_prompts=full["sample"]["distinct_prompts"],
        compare_embedded_prompts=est["sample"]["embedded_prompts"],
        hit_rate_full=cells_full[rec["threshold"], rec["ttl_s"]]["hit_rate_total"],
        hit_rate_estimated=cells_est[rec["threshold"], rec["ttl_s"]]["hit_rate_total"],
        at=[rec["threshold"], rec["ttl_s"]],
    )


if __name__ == "__main__":
    main()
