"""A request log read into columns, each request reduced to the exact-cache key it would use.

The key is the one caches/keys.py builds (normalised prompt, canonical params, context hash,
tenant, model id+version, template version), so "exact duplicate" here means "would have hit
the exact cache". Parsing runs once per distinct cell, not per row: a 100k-row log has a few
hundred distinct params / context cells and ~30k distinct prompts.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import orjson
import pandas as pd
from pydantic import ValidationError

from caches.keys import canonical_params, context_hash, normalise_prompt
from caches.policy import request_bypass_reason
from schemas.common import DocRef, RequestParams
from schemas.errors import ConfigError, FatalError
from streams.replay import detect_format

TEXT_COLUMNS = ("tenant", "model_id", "model_version", "template_version", "prompt")
REQUIRED = ("ts", *TEXT_COLUMNS, "gpu_ms")
UNCACHEABLE = -1  # key id of a request that must never be cached (temperature > 0, no-cache)


class UnreadableLog(FatalError):
    """The log cannot be read at all (missing file, wrong format, required columns absent)."""


class UnknownColumn(ConfigError):
    """--labels names a column the log does not have (bad usage, not a bad log)."""


@dataclass(frozen=True)
class KeyedLog:
    """Valid requests in time order. Invariant: keys of one group share every must-filter field
    of the semantic cache (tenant, model id+version, template version, context hash, params)."""

    ts: npt.NDArray[np.float64]  # seconds since the epoch, ascending
    tenant: npt.NDArray[np.int64]  # index into `tenants`
    key: npt.NDArray[np.int64]  # exact-key id, UNCACHEABLE for bypassed requests
    gpu_ms: npt.NDArray[np.float64]
    label: npt.NDArray[np.int64] | None  # label id per request, -1 = no label; scoring only
    tenants: tuple[str, ...]
    key_group: npt.NDArray[np.int64]  # semantic group id of each key
    key_prompt: list[str]  # normalised prompt of each key
    rows: int  # rows read, valid or not
    bad: dict[str, int] = field(default_factory=dict)  # reason -> rows skipped

    @property
    def requests(self) -> int:
        return len(self.ts)


def read_frame(path: Path) -> pd.DataFrame:
    """The raw table; UnreadableLog if the file or its format cannot be read."""
    if not path.is_file():
        raise UnreadableLog(f"{path}: no such file")
    try:
        fmt = detect_format(path)
        if fmt == "parquet":
            return pd.read_parquet(path)
        if fmt == "csv":
            return pd.read_csv(path, dtype=str, keep_default_na=False)
        return _read_jsonl(path)
    except UnreadableLog:
        raise
    except Exception as exc:  # pyarrow, pandas and orjson each raise their own kinds
        raise UnreadableLog(f"cannot read {path}: {exc}") from exc


def _read_jsonl(path: Path) -> pd.DataFrame:
    rows: list[dict[str, Any]] = []
    with path.open("rb") as f:
        for line in f:
            if not line.strip():
                continue
            try:
                obj = orjson.loads(line)
            except orjson.JSONDecodeError:
                obj = None
            rows.append(obj if isinstance(obj, dict) else {"_bad": "bad_json"})
    return pd.DataFrame.from_records(rows)


def key_frame(frame: pd.DataFrame, labels: str | None = None) -> KeyedLog:
    """Validate, key and time-sort the rows; rows that cannot be keyed are counted, not kept."""
    missing = [c for c in REQUIRED if c not in frame.columns]
    if missing:
        raise UnreadableLog(f"the log lacks required column(s): {', '.join(missing)}")
    if labels is not None and labels not in frame.columns:
        raise UnknownColumn(
            f"no column {labels!r} in the log (columns: {', '.join(frame.columns)})"
        )
    n = len(frame)
    bad = pd.Series("", index=frame.index, dtype=object)
    ts = _seconds(frame["ts"])
    bad[np.isnan(ts)] = "bad_ts"
    for col in TEXT_COLUMNS:
        text = frame[col]
        bad[(bad == "") & (text.isna() | (text.astype(str) == ""))] = f"missing_{col}"
    gpu = pd.to_numeric(frame["gpu_ms"], errors="coerce").to_numpy(dtype=np.float64)
    bad[(bad == "") & ~(gpu >= 0)] = "bad_gpu_ms"
    params = _parse_cells(frame.get("params"), frame.index, _params_cell)
    docs = _parse_cells(frame.get("context_docs"), frame.index, _docs_cell)
    bad[(bad == "") & params.isna()] = "bad_params"
    bad[(bad == "") & docs.isna()] = "bad_context_docs"
    if "_bad" in frame.columns:
        bad[frame["_bad"].notna()] = "bad_json"
    ok = (bad == "").to_numpy()
    order = np.argsort(ts[ok], kind="stable")
    sub = frame.loc[ok].iloc[order]
    cells = (params[ok].iloc[order], docs[ok].iloc[order])
    reasons = bad[~ok].value_counts().to_dict()
    return _keyed(sub, ts[ok][order], gpu[ok][order], cells, labels, n, reasons)


def _seconds(col: pd.Series[Any]) -> npt.NDArray[np.float64]:
    if pd.api.types.is_numeric_dtype(col):  # epoch seconds
        return np.asarray(pd.to_numeric(col, errors="coerce"), dtype=np.float64)
    if pd.api.types.is_datetime64_any_dtype(col):
        dt = pd.to_datetime(col, utc=True)
    else:
        dt = pd.to_datetime(col.astype(str), utc=True, errors="coerce", format="ISO8601")
    secs = (dt - pd.Timestamp(0, tz="UTC")).dt.total_seconds()
    return np.asarray(secs.to_numpy(dtype=np.float64, na_value=np.nan), dtype=np.float64)


def _parse_cells(col: pd.Series[Any] | None, index: pd.Index, parse: Any) -> pd.Series[Any]:
    """Each distinct cell parsed once; None where the cell is invalid (an absent column = empty)."""
    if col is None:
        return pd.Series([parse(None)] * len(index), index=index, dtype=object)
    cells = [_hashable(v) for v in col.tolist()]
    parsed = {c: parse(c) for c in set(cells)}
    return pd.Series([parsed[c] for c in cells], index=col.index, dtype=object)


def _hashable(v: Any) -> Hashable:
    if hasattr(v, "tolist") and not isinstance(v, str):  # numpy arrays from parquet lists
        v = v.tolist()
    if isinstance(v, dict | list):
        return orjson.dumps(v, option=orjson.OPT_SORT_KEYS).decode()
    if v is None or (isinstance(v, float) and np.isnan(v)) or v == "":
        return None
    return str(v)


def _params_cell(cell: str | None) -> tuple[str | None] | None:
    """(canonical params,) or (None,) when the request bypasses the cache; None when invalid."""
    try:
        p = RequestParams.model_validate(orjson.loads(cell) if cell else {})
    except (orjson.JSONDecodeError, ValidationError):
        return None
    if request_bypass_reason(p) is not None:
        return (None,)
    return (canonical_params(p.as_dict()),)


def _docs_cell(cell: str | None) -> tuple[DocRef, ...] | None:
    try:
        raw = orjson.loads(cell) if cell else []
        return tuple(DocRef.model_validate(d) for d in raw)
    except (orjson.JSONDecodeError, ValidationError, TypeError):
        return None


def _keyed(
    sub: pd.DataFrame,
    ts: npt.NDArray[np.float64],
    gpu: npt.NDArray[np.float64],
    cells: tuple[pd.Series[Any], pd.Series[Any]],
    labels: str | None,
    rows: int,
    bad: dict[str, int],
) -> KeyedLog:
    params, docs = cells
    tenant_codes, tenants = pd.factorize(sub["tenant"].astype(str), sort=True)
    keys: dict[tuple[str, ...], int] = {}
    groups: dict[tuple[str, ...], int] = {}
    key_group: list[int] = []
    key_prompt: list[str] = []
    norm: dict[str, str] = {}
    key = np.full(len(sub), UNCACHEABLE, dtype=np.int64)
    cols = [sub[c].astype(str).tolist() for c in TEXT_COLUMNS]
    for i, (tenant, model, version, tmpl, prompt) in enumerate(zip(*cols, strict=True)):
        (canon,) = params.iat[i]
        if canon is None:
            continue
        g = (tenant, model, version, tmpl, context_hash(model, tmpl, docs.iat[i]), canon)
        gid = groups.setdefault(g, len(groups))
        p = norm.get(prompt)
        if p is None:
            p = norm[prompt] = normalise_prompt(prompt)
        kid = keys.setdefault((*g, p), len(keys))
        if kid == len(key_prompt):
            key_group.append(gid)
            key_prompt.append(p)
        key[i] = kid
    label = None
    if labels is not None:
        col = sub[labels]
        known = col.where(col.notna() & (col.astype(str) != "")).astype(object)
        label = pd.factorize(known)[0].astype(np.int64)  # NaN -> -1
    return KeyedLog(
        ts=ts,
        tenant=tenant_codes.astype(np.int64),
        key=key,
        gpu_ms=gpu,
        label=label,
        tenants=tuple(str(t) for t in tenants),
        key_group=np.asarray(key_group, dtype=np.int64),
        key_prompt=key_prompt,
        rows=rows,
        bad={str(k): int(v) for k, v in bad.items()},
    )
