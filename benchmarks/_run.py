"""`make bench`: every benchmarks/bench_*.py in turn, the slow rows only when asked.

The default run fits in half an hour on a 2-core machine. The slow rows need a real model
server for minutes, the real-model semantic eval, or many seeds and weeks of simulated logs;
they run with `--slow` (`BENCH_SLOW=1 make bench`), and a default run prints one line,
`bench_slow_rows_skipped`, naming each with the command that runs it. Every script's lines go
to stdout and, through BENCH_RESULTS_FILE, to the results file.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
# script -> (arguments of the default run, the rows those arguments leave out); SKIP: the
# script does not run by default at all
SKIP = ["--skip"]
FAST: dict[str, tuple[list[str], str]] = {
    "bench_analyze_1m.py": (SKIP, "analyze_1m (a million-row log: 10-12 min of its own)"),
    "bench_backend_protection.py": (["--no-real"], "backend_protection_real"),
    "bench_gateway_semantic.py": (
        ["--batcher-turns", "1"],
        "embed_batcher_passes over 3 turns of each policy (the default run: 1, ~1 min less)",
    ),
    "bench_hot_set.py": (
        ["--seeds", "1", "--verified-levels", "none"],
        "hot_set_* over 3 sample logs (the default run: the committed one, ~3 min a log), and"
        " hot_set_k<K>_verified_l3/_l7 (the matcher held at a level: ~3 min more a log)",
    ),
    "bench_miss_cost.py": (SKIP, "miss_cost_real (the real model, 3 fresh stacks: ~3 min)"),
    "bench_prefix_warm.py": (["--no-real"], "prefix_warm_real"),
    "bench_profile_memory.py": (
        ["--sizes", "100k,1m"],
        "profile_memory at 5M distinct queries a week (~4 min; 100k and 1M already past the"
        " budget)",
    ),
    "bench_semantic_quality.py": (
        ["--only", "simulated", "--long-history", "-1", "--coverage-seeds", "0"],
        "semantic_quality_clinc_real, semantic_candidates_real (a real model server), "
        "semantic_quality_clinc_long_history (18,200 earlier queries: ~25 min), "
        "semantic_monitor_coverage (5 more orders of the stream)",
    ),
    "bench_warm_vs_naive.py": (
        ["--seeds", "1", "--datasets", "sample"],
        "warm_vs_naive_* over 3 seeds and the five traffic shapes",
    ),
    "bench_analyze_warming.py": (SKIP, "analyze_warming_* (a week replayed: ~20 min a seed)"),
}
# rows no default run makes: only by their own command
SLOW_ONLY: dict[str, list[list[str]]] = {
    "bench_warm_vs_naive.py": [["--history-days", "7", "--seeds", "1"], ["--drift"]],
    "bench_analyze_warming.py": [["--shapes"]],
}


def scripts() -> list[Path]:
    return sorted(HERE.glob("bench_*.py"))


def commands(slow: bool) -> list[list[str]]:
    out = []
    for path in scripts():
        extra = [] if slow else FAST.get(path.name, ([], ""))[0]
        if extra != SKIP:
            out.append([path.name, *extra])
        if slow:
            out += [[path.name, *more] for more in SLOW_ONLY.get(path.name, [])]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--slow", action="store_true", help="the slow rows too (BENCH_SLOW=1)")
    ap.add_argument("--dry-run", action="store_true", help="print the commands, run none")
    ap.add_argument("--only", default="", help="these scripts alone (comma-separated names)")
    args = ap.parse_args()
    todo = commands(args.slow)
    if args.only:
        names = set(args.only.split(","))
        unknown = names - {p.name for p in scripts()}
        if unknown:
            ap.error(f"--only: no script {', '.join(sorted(unknown))} in benchmarks/")
        todo = [c for c in todo if c[0] in names]
    if args.dry_run:
        for cmd in todo:
            print(" ".join(["benchmarks/" + cmd[0], *cmd[1:]]))
        return
    t0 = time.monotonic()
    for n, cmd in enumerate(todo, 1):
        print(f"bench: [{n}/{len(todo)}, {time.monotonic() - t0:,.0f} s] {' '.join(cmd)}",
              file=sys.stderr, flush=True)  # fmt: skip
        got = subprocess.run([sys.executable, str(HERE / cmd[0]), *cmd[1:]], check=False)
        if got.returncode:
            sys.exit(f"bench: {cmd[0]} failed (exit {got.returncode})")
    print(f"bench: {len(todo)} scripts in {time.monotonic() - t0:,.0f} s", file=sys.stderr)
    if not args.slow:
        sys.path.insert(0, str(HERE))
        from _common import emit

        emit(
            "bench_slow_rows_skipped",
            rows={name: rows for name, (_, rows) in FAST.items()},
            also=[" ".join([name, *more]) for name, runs in SLOW_ONLY.items() for more in runs],
            run_them="BENCH_SLOW=1 make bench",
        )


if __name__ == "__main__":
    main()
