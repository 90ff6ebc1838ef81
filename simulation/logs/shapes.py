"""Two-week logs of traffic shapes the planner must survive, from CLINC150's utterances.

sample_log.py builds one shape (a stable weekly cycle), and a planner tuned to it can lose to a
naive global top-K elsewhere. Each shape here is a base world (2 tenants, each ranking the 150
intents by its own Zipf, each intent's `train` phrasings by Zipf, 20% carrying a filler, a
diurnal curve, weekends at 0.55) changed in one way:
- `drift`: every intent's rate trends across the two weeks (log-rate slope ~ N(0, 0.7) per
  week) and 8 intents rise x6 from week 1 to week 2: week 1's ranking goes stale;
- `surge`: 12 intents each surge x25 for 2-3 hours at one hour of the week, every week (a
  payroll Friday, a Monday-morning outage report): the hour matters, the week repeats;
- `incident`: 3 intents never asked in week 1 burst in week 2 (one for 6 hours from day 10
  12:00, one for 8 hours from day 12 01:00, one for 4 hours from day 11 18:00), each up to
  a fifth of the traffic while it lasts: only the live log can see them coming;
- `longtail`: 45% of requests are one-offs (an out-of-scope utterance with a detail: "... for
  order 4821"), asked once each;
- `quiet`: nights (00-06) carry 3% of the day's volume, asked from a night mix of their own
  (each tenant's 20 night intents): a quiet hour is not a small busy hour.
Columns are sample_log.py's (`intent` is a label for scoring only, "oos" for one-offs), so the
traffic worker's observe path and `stoker replay` read them as they read the sample log.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import numpy as np
import pandas as pd

from simulation.logs.sample import DIURNAL, START, _zipf, load_clinc, one_off, vary

SHAPES = ("drift", "surge", "incident", "longtail", "quiet")
DAYS = 14
# (intent slot among the week-1-unseen ones, start day, start hour, hours): see the docstring
INCIDENTS = ((0, 10, 12, 6), (1, 12, 1, 8), (2, 11, 18, 4))


@dataclass(frozen=True)
class ShapeSpec:
    shape: str
    requests_per_day: int = 4_000
    tenants: tuple[str, ...] = ("acme", "globex")
    zipf_intents: float = 1.0
    zipf_phrasings: float = 1.0
    variation_share: float = 0.20
    one_off_share: float = 0.05  # the base world's; `longtail` raises it
    weekend_factor: float = 0.55
    seed: int = 170

    def __post_init__(self) -> None:
        if self.shape not in SHAPES:
            raise ValueError(f"unknown traffic shape {self.shape!r}: one of {', '.join(SHAPES)}")


def _rates(spec: ShapeSpec, n_intents: int, rng: np.random.Generator) -> np.ndarray:
    """Per tenant, hour of the two weeks and intent: the relative rate (rows need not sum to 1)."""
    hours = DAYS * 24
    out = np.empty((len(spec.tenants), hours, n_intents))
    week = np.arange(hours) / (7 * 24)  # weeks since the start, fractional
    unseen = rng.choice(n_intents, len(INCIDENTS), replace=False)  # an incident hits everyone
    for t in range(len(spec.tenants)):
        base = _zipf(n_intents, spec.zipf_intents)[rng.permutation(n_intents)]
        out[t] = base[None, :]
        if spec.shape == "drift":
            slope = rng.normal(0.0, 0.7, n_intents)
            out[t] *= np.exp(slope[None, :] * week[:, None])
            rising = rng.choice(n_intents, 8, replace=False)
            out[t][:, rising] *= np.where(week >= 1.0, 6.0, 1.0)[:, None]
        elif spec.shape == "surge":
            for i in rng.choice(n_intents, 12, replace=False).tolist():
                at, span = int(rng.integers(7 * 24)), int(rng.integers(2, 4))
                for w in range(2):
                    out[t, w * 168 + at : w * 168 + at + span, i] *= 25.0
        elif spec.shape == "incident":
            out[t][:, unseen] = 0.0
            for slot, day, hour, span in INCIDENTS:
                start = day * 24 + hour
                # a fifth of the traffic at its height, ramping up over its first hour
                ramp = np.minimum(1.0, (np.arange(span) + 1) / 2.0)
                out[t, start : start + span, unseen[slot]] = 0.25 * ramp
        elif spec.shape == "quiet":
            night = rng.choice(n_intents, 20, replace=False)
            mix = np.zeros(n_intents)
            mix[night] = _zipf(20, 1.0)
            hod = np.arange(hours) % 24
            out[t][hod < 6] = mix[None, :]
    return out


def generate(spec: ShapeSpec, data_dir: Path | None = None) -> pd.DataFrame:
    """The log, one row per request in time order."""
    rng = np.random.default_rng(spec.seed + SHAPES.index(spec.shape))
    phrasings = load_clinc("train", data_dir)
    pool = load_clinc("oos_train", data_dir)["oos"] + load_clinc("oos_val", data_dir)["oos"]
    intents = sorted(i for i in phrasings if i != "oos")
    rates = _rates(spec, len(intents), rng)
    diurnal = DIURNAL.copy()
    if spec.shape == "quiet":
        diurnal[:6] = 0.03 * diurnal[6:].mean()
    one_off_share = 0.45 if spec.shape == "longtail" else spec.one_off_share
    per_hour = spec.requests_per_day / diurnal.sum() / len(spec.tenants)
    ts: list[float] = []
    tenant: list[str] = []
    prompt: list[str] = []
    label: list[str] = []
    for h in range(DAYS * 24):
        at = START + timedelta(hours=h)
        lam = per_hour * diurnal[h % 24] * (spec.weekend_factor if at.weekday() >= 5 else 1.0)
        for t, name in enumerate(spec.tenants):
            n = int(rng.poisson(lam))
            if not n:
                continue
            p = rates[t, h] / rates[t, h].sum()
            picks = rng.choice(len(intents), size=n, p=p)
            for s, i in zip(np.sort(rng.uniform(0, 3600, n)).tolist(), picks.tolist(), strict=True):
                if rng.random() < one_off_share:
                    text, intent = one_off(pool, rng), "oos"
                else:
                    options = phrasings[intents[i]]
                    k = int(rng.choice(len(options), p=_zipf(len(options), spec.zipf_phrasings)))
                    text, intent = options[k], intents[i]
                    if rng.random() < spec.variation_share:
                        text = vary(text, rng)
                ts.append(at.timestamp() + s)
                tenant.append(name)
                prompt.append(text)
                label.append(intent)
    return _frame(ts, tenant, prompt, label, rng)


def _frame(
    ts: list[float],
    tenant: list[str],
    prompt: list[str],
    label: list[str],
    rng: np.random.Generator,
) -> pd.DataFrame:
    n = len(ts)
    tokens_in = np.asarray([150 + math.ceil(len(p.split()) * 1.3) for p in prompt])
    tokens_out = np.clip(rng.lognormal(4.7, 0.5, n), 8, 1024).astype(np.int64)
    gpu_ms = np.round(0.15 * tokens_in + 12.0 * tokens_out, 1)
    df = pd.DataFrame(
        {
            "ts": pd.to_datetime(np.asarray(ts), unit="s", utc=True),
            "tenant": tenant,
            "model_id": "llama-3-8b",
            "model_version": "2026-11-01",
            "template_version": "t1",
            "prompt": prompt,
            "params": '{"temperature":0.0,"max_tokens":512}',
            "context_docs": "[]",
            "cache_outcome": "miss",
            "latency_ms": gpu_ms + 20.0,
            "gpu_ms": gpu_ms,
            "tokens_in": tokens_in,
            "tokens_out": tokens_out,
            "intent": label,
        }
    )
    df = df.sort_values("ts", kind="stable").reset_index(drop=True)
    df["request_id"] = [f"req-{i:07d}" for i in range(len(df))]
    return df
