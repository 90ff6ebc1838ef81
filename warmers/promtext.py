"""Sample values read from a backend's Prometheus text (its /metrics), by metric name.

One regex over the whole text (C speed: the warmer reads a vLLM /metrics, hundreds of lines
of histograms, once a second on its event loop); labels are not parsed, every label set of a
name is one more value. NaN and unparsable values say nothing and are left out.
"""

from __future__ import annotations

import re
from collections.abc import Collection

_SAMPLE = re.compile(r"^([A-Za-z_:][A-Za-z0-9_:]*)(?:\{[^}]*\})?[ \t]+(\S+)", re.MULTILINE)


def samples(metrics: str, names: Collection[str]) -> dict[str, list[float]]:
    """name -> the values of its samples (one per label set), for the names asked that occur."""
    out: dict[str, list[float]] = {}
    for name, raw in _SAMPLE.findall(metrics):
        if name not in names:
            continue
        try:
            value = float(raw)
        except ValueError:
            continue
        if value == value:  # NaN
            out.setdefault(name, []).append(value)
    return out
