"""The long-tailed log generator: the shape `stoker analyze` reads, and a tail that grows."""

from __future__ import annotations

import numpy as np
import pandas as pd

from audits.whatif.keyed_log import key_frame
from simulation.logs.longtail import LongTailSpec, generate


def _log(rows: int) -> pd.DataFrame:
    return generate(LongTailSpec(rows=rows, seed=3))


def test_longtail_log__shape_as_analyze_reads_it() -> None:
    frame = _log(10_000)
    log = key_frame(frame, labels="intent")
    assert log.requests == 10_000 and not log.bad
    assert bool((np.diff(log.ts) >= 0).all())
    assert 0.37 < float((frame["intent"] == "oos").mean()) < 0.43  # the one-off share
    uncacheable = float((log.key < 0).mean())
    assert 0.06 < uncacheable < 0.10  # 7% sampled + 1% no-cache
    assert set(frame["tenant"]) == {f"tenant-{i}" for i in range(5)}
    # the distinct prompts grow with the log: a long tail, not a fixed vocabulary
    bigger = key_frame(_log(20_000))
    assert len(set(bigger.key_prompt)) > 1.6 * len(set(log.key_prompt))
    assert generate(LongTailSpec(rows=500, seed=3)).equals(generate(LongTailSpec(rows=500, seed=3)))
