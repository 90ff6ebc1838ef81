"""eval-semantic's labelled queries: CLINC150 (test + oos_test, val + oos_val or train + val as
earlier traffic) or any labelled CSV, shuffled with a fixed seed. Labels go to the scorer alone."""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

from caches.matching.base import Vector
from schemas.errors import UsageError
from simulation.logs.sample import read_clinc
from stoker.data import clinc_path

OOS = "oos"
Pairs = list[tuple[str, str]]


def load_clinc(path: Path | None = None) -> dict[str, Pairs]:
    """CLINC150 by split (simulation.logs.sample.read_clinc: the one reader of the file), from
    `path` or the data_dir setting's (STOKER_DATA_DIR)."""
    return read_clinc(path if path is not None else clinc_path())


def query_stream(data: dict[str, Pairs], seed: int, limit: int | None = None) -> Pairs:
    rows = data["test"] + data["oos_test"]
    random.Random(seed).shuffle(rows)
    return rows[:limit] if limit else rows


# The earlier traffic --history-split names: CLINC150 splits whose utterances the test stream
# never repeats. val (3,100 queries) gives the budget ~110 audits of served hits at the default
# monitor share; train+val (18,200) is a busy route's days, enough audits for a looser level.
HISTORY_SPLITS: dict[str, tuple[str, ...]] = {
    "val": ("val", "oos_val"),
    "train+val": ("train", "oos_train", "val", "oos_val"),
}


def history_keys(name: str) -> tuple[str, ...]:
    """The CLINC150 splits of a --history-split value; a UsageError naming the choices."""
    if name not in HISTORY_SPLITS:
        raise UsageError(f"--history-split {name!r}: one of {', '.join(HISTORY_SPLITS)}")
    return HISTORY_SPLITS[name]


def history_stream(data: dict[str, Pairs], seed: int, split: str = "val") -> Pairs:
    """The earlier traffic of the default protocol: CLINC150's val + oos_val (`split`: or
    another HISTORY_SPLITS entry), shuffled."""
    rows = [r for key in history_keys(split) for r in data[key]]
    random.Random(seed).shuffle(rows)
    return rows


def data_name(path: Path) -> str:
    """What a --data file's summary lines are named after: its file name without the suffix,
    lower case, each run of other characters an underscore ("Bank Queries.csv":
    semantic_quality_bank_queries)."""
    import re

    return re.sub(r"[^a-z0-9]+", "_", path.stem.lower()).strip("_") or "data"


def load_csv(path: Path, text_col: str, label_col: str) -> Pairs:
    """(text, label) rows of a labelled CSV; a clear error for a missing file or column."""
    import pandas as pd

    if not path.exists():
        raise UsageError(f"{path}: no such file")
    try:
        df = pd.read_csv(path, dtype=str, keep_default_na=False)
    except (ValueError, OSError) as e:  # pandas' ParserError is a ValueError
        raise UsageError(f"{path}: not a readable CSV ({e})") from e
    missing = [c for c in (text_col, label_col) if c not in df.columns]
    if missing:
        raise UsageError(f"{path}: no column {missing[0]!r} (columns: {', '.join(df.columns)})")
    rows = [(t, lab) for t, lab in zip(df[text_col], df[label_col], strict=True) if t.strip()]
    if not rows:
        raise UsageError(f"{path}: no row with text in column {text_col!r}")
    return rows


def split_history(rows: Pairs, share: float, seed: int) -> tuple[Pairs, Pairs | None]:
    """(stream, earlier traffic): the first `share` of the rows, shuffled by `seed`, become the
    earlier traffic (None when share is 0: a cold start)."""
    if not share:
        return rows, None
    rows = list(rows)
    random.Random(seed ^ 0x5EED).shuffle(rows)
    k = int(len(rows) * share)
    if k == 0 or k == len(rows):
        raise UsageError(f"--history-share {share} leaves no earlier traffic or no stream")
    return rows[k:], rows[:k]


@dataclass(frozen=True)
class Stream:
    """The embedded protocol input: queries, their vectors, the backend's answers to each."""

    texts: list[str]
    labels: list[str]
    oos_label: str
    qv: Vector
    live: list[str]
    live_v: Vector
    again: list[str]
    again_v: Vector
