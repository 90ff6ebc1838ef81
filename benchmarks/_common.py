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


def pct(samples_s: Sequence[float], q: float) -> float:
    """Percentile in milliseconds."""
    return float(np.percentile(np.asarray(samples_s) * 1000.0, q))


def emit(name: str, **figures: Any) -> None:
    print(
        orjson.dumps({"name": name, **figures}, option=orjson.OPT_SERIALIZE_NUMPY).decode(),
        flush=True,
    )
