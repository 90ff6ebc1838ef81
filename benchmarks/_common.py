"""Shared bits for benchmarks: percentiles and one-JSON-object-per-line output."""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import orjson

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


def shipped_embedder(*, bulk: bool = False) -> Any:
    """The local embedder as every stoker process builds it: the default options (ONNX Runtime
    on an export kept in the model cache, one thread), so a figure measures the vectors and the
    speed that ship. The export is made once per machine; when ONNX cannot serve, one warning
    says why and torch serves the same vectors.

    `bulk`: a benchmark that embeds a whole data set up front, where the embedding's speed is
    no figure (a quality or coverage row), runs the engine on every core (1.8x on 2 idle cores);
    the vectors are the same within the engine's tolerance, checked at load."""
    from caches.embedders import EmbedderOptions, SentenceTransformerEmbedder
    from stoker.modelserver import cache_root

    opts = EmbedderOptions(threads=os.cpu_count() or 1) if bulk else EmbedderOptions()
    return SentenceTransformerEmbedder.from_options(opts, cache_root())


def pct(samples_s: Sequence[float], q: float) -> float:
    """Percentile in milliseconds."""
    return float(np.percentile(np.asarray(samples_s) * 1000.0, q))


# `make bench` names a results file here: every line is appended to it too, with the script
# that printed it and its arguments (benchmarks/_provenance.py opens the file with the commit,
# date and machine).
# Not a STOKER_ name: every stoker verb a benchmark starts rejects an unknown STOKER_ setting.
RESULTS_ENV = "BENCH_RESULTS_FILE"


def emit(name: str, **figures: Any) -> None:
    line = orjson.dumps({"name": name, **figures}, option=orjson.OPT_SERIALIZE_NUMPY).decode()
    print(line, flush=True)
    results = os.environ.get(RESULTS_ENV)
    if results:
        row = {"name": name, "script": Path(sys.argv[0]).name, "args": sys.argv[1:], **figures}
        with open(results, "ab") as f:
            f.write(orjson.dumps(row, option=orjson.OPT_SERIALIZE_NUMPY) + b"\n")


class SeedRows:
    """Rows gathered over runs on several seeds, emitted once each: every number (bools aside)
    that differs between the runs as its mean over them, anything else as the first run gave
    it, the seeds, and `over_seeds`: each number's mean, sd, min and max (demo.seeds.spread)."""

    def __init__(self) -> None:
        self.runs: dict[str, list[dict[str, Any]]] = {}

    def add(self, name: str, **figures: Any) -> None:
        self.runs.setdefault(name, []).append(figures)

    def emit(self, seeds: Sequence[int]) -> None:
        from demo.seeds import spread

        for name, runs in self.runs.items():
            numbers = [k for k, v in runs[0].items() if is_number(v)]
            spreads = {k: spread([run.get(k) for run in runs]) for k in numbers}
            means = {
                k: s["mean"]
                for k, s in spreads.items()
                if s is not None and len({run.get(k) for run in runs}) > 1
            }
            emit(name, **(runs[0] | means), seeds=list(seeds), over_seeds=spreads)


def is_number(v: Any) -> bool:
    return isinstance(v, int | float | np.number) and not isinstance(v, bool)
