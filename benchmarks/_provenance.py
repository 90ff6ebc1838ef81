"""The first line of a results file: where and when its figures were measured.

`make bench` runs this before the benchmarks: the commit (and whether the tree had changes
beside it), the date, the machine (CPU model and count, memory, Python, OS) and its load, so a
figure in docs/benchmarks.md can name the run it came from. Printed as one JSON line named
`provenance`; with `--end`, the line named `provenance_end` (the date and load when the run
finished). `--slow` and `--only` say which run it opens: the default one, whose lines make the
recorded-run table, or one with the slow rows (BENCH_SLOW=1), perhaps of a few scripts."""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
from datetime import UTC, datetime
from typing import Any

import orjson

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _git(*args: str) -> str | None:
    try:
        out = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _memory_gb() -> float | None:
    try:
        return round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 1e9, 1)
    except (ValueError, OSError, AttributeError):
        return None


def provenance(end: bool = False, slow: bool = False, only: str = "") -> dict[str, Any]:
    now = datetime.now(UTC).isoformat(timespec="seconds")
    load = [round(x, 2) for x in os.getloadavg()]
    if end:
        return {"name": "provenance_end", "date": now, "load_avg": load}
    status = _git("status", "--porcelain", "--untracked-files=no")
    return {
        "name": "provenance",
        "commit": _git("rev-parse", "HEAD"),
        "dirty": bool(status) if status is not None else None,
        "date": now,
        "machine": {
            "cpu": _cpu_model(), "cpus": os.cpu_count(), "memory_gb": _memory_gb(),
            "python": platform.python_version(), "os": platform.platform(),
        },
        "load_avg": load,  # 1, 5 and 15 minutes: other work on the cores moves every figure
        # which run: the default one (the recorded-run table) or one with the slow rows
        "slow": slow,
        "only": [name for name in only.split(",") if name],
    }  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--end", action="store_true", help="the closing line: date and load")
    ap.add_argument("--slow", action="store_true", help="the run makes the slow rows too")
    ap.add_argument("--only", default="", help="the run's scripts, if not all (comma-separated)")
    args = ap.parse_args()
    print(orjson.dumps(provenance(args.end, args.slow, args.only)).decode(), flush=True)


if __name__ == "__main__":
    main()
