"""`stoker analyze` on small logs whose duplicate structure is known by construction."""

from __future__ import annotations

import os
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pandas as pd
import pytest

from audits.whatif.recommend import VERDICT_BAR, verdict
from audits.whatif.report import Settings, analyze
from caches.embedders import SentenceTransformerEmbedder

T0 = 1_790_000_000.0  # epoch seconds; any fixed start
HOUR, DAY = 3_600, 86_400
DISTINCT = [
    "what is the capital of australia",
    "how do i reset my router password",
    "recommend a vegetarian lasagna recipe",
    "when does the next train to boston leave",
    "explain how photosynthesis works",
    "book a table for four at an italian restaurant",
    "what is my checking account balance",
    "translate good morning into japanese",
    "how many miles is a marathon",
    "set an alarm for six thirty tomorrow",
]
WEATHER = ("what is the weather like today", "how is the weather today")
CONVERT = ("how do i convert celsius to fahrenheit", "how do i convert fahrenheit to celsius")


@pytest.fixture(scope="module")
def embedder() -> SentenceTransformerEmbedder:
    return SentenceTransformerEmbedder()


def cos(embedder: SentenceTransformerEmbedder, a: str, b: str) -> float:
    v = embedder.embed([a, b])
    return float(v[0] @ v[1])


def req(prompt: str, t: float, tenant: str = "acme", **kw: Any) -> dict[str, Any]:
    params = {"temperature": kw.get("temperature", 0.0), "max_tokens": 256}
    if kw.get("no_cache"):
        params["no_cache"] = True
    return {
        "ts": pd.Timestamp(T0 + t, unit="s", tz="UTC"),
        "tenant": tenant,
        "model_id": "m",
        "model_version": kw.get("version", "v1"),
        "template_version": "t1",
        "prompt": prompt,
        "params": orjson.dumps(params).decode(),
        "context_docs": orjson.dumps(kw.get("docs", [])).decode(),
        "gpu_ms": kw.get("gpu_ms", 100.0),
        "intent": kw.get("label"),
    }


def run(embedder: SentenceTransformerEmbedder, rows: list[dict[str, Any]], **kw: Any) -> Any:
    return analyze(pd.DataFrame(rows), Settings(**kw), embedder)


def cell(report: dict[str, Any], threshold: float | None, ttl_s: int) -> dict[str, Any]:
    sim = report["simulation"]
    g = next(g for g in sim if g["threshold"] == threshold and g["ttl_s"] == ttl_s)
    return dict(g["overall"])


def test_analyze__each_prompt_asked_three_times_is_two_thirds_exact(embedder):
    rows = [req(p, 60 * i) for i, p in enumerate(DISTINCT)]
    # the same prompts again, with case and whitespace changed: normalisation makes them equal
    rows += [req(f"  {p.upper()} ", 3_600 + 60 * i) for i, p in enumerate(DISTINCT)]
    rows += [req(p.replace(" ", "   "), 7_200 + 60 * i) for i, p in enumerate(DISTINCT)]
    r = run(embedder, rows, ttls_s=(DAY,))
    dup = r["duplicates"]["overall"]
    assert dup["exact_dup_rate"] == pytest.approx(2 / 3, abs=1e-6)
    assert all(n["near_dup_rate"] == 0 for n in dup["near_dup"])
    for thr in (None, *r["settings"]["thresholds"]):
        c = cell(r, thr, DAY)
        assert c["hit_rate_exact"] == pytest.approx(2 / 3, abs=1e-6)
        assert c["hit_rate_semantic"] == 0
        assert c["gpu_seconds_saved"] == pytest.approx(20 * 0.1)


def test_analyze__paraphrase_hits_at_thresholds_up_to_its_cosine(embedder):
    c = cos(embedder, *WEATHER)
    below, above = round(c - 0.01, 4), round(c + 0.01, 4)
    r = run(embedder, [req(WEATHER[0], 0), req(WEATHER[1], 60)], thresholds=(below, above))
    near = {n["threshold"]: n["near_dup_rate"] for n in r["duplicates"]["overall"]["near_dup"]}
    assert near == {below: 0.5, above: 0.0}
    assert cell(r, below, HOUR)["hit_rate_semantic"] == 0.5
    assert cell(r, above, HOUR)["hit_rate_semantic"] == 0.0
    assert cell(r, None, HOUR)["hit_rate_total"] == 0.0


def test_analyze__sampled_and_no_cache_requests_never_count(embedder):
    p = DISTINCT[0]
    rows = [req(p, 0, temperature=0.7), req(p, 10, temperature=0.7), req(p, 20, no_cache=True)]
    # a bypassed request writes nothing: the first cacheable one still misses
    rows += [req(p, 30), req(p, 40)]
    r = run(embedder, rows)
    dup = r["duplicates"]["overall"]
    assert dup["uncacheable_rate"] == pytest.approx(3 / 5)
    assert dup["exact_dup_rate"] == pytest.approx(1 / 5)
    for g in r["simulation"]:
        assert g["overall"]["hit_rate_total"] == pytest.approx(1 / 5)


def test_analyze__tenants_and_versions_never_share_hits(embedder):
    rows = [
        req(WEATHER[0], 0, tenant="a"),
        req(WEATHER[0], 10, tenant="b"),
        req(WEATHER[1], 20, tenant="c"),
        req(WEATHER[0], 30, tenant="a", version="v2"),
        req(WEATHER[0], 40, tenant="a", docs=[{"doc_id": "kb/1", "version": 1}]),
    ]
    r = run(embedder, rows, thresholds=(0.5,))
    assert r["duplicates"]["overall"]["exact_dup_rate"] == 0
    assert r["duplicates"]["overall"]["near_dup"][0]["near_dup_rate"] == 0
    assert all(g["overall"]["hit_rate_total"] == 0 for g in r["simulation"])
    assert set(r["duplicates"]["tenants"]) == {"a", "b", "c"}


def test_analyze__ttl_expiry_as_computed_by_hand(embedder):
    p = DISTINCT[1]
    # 1h: miss (lives to 3600), hit, miss at 3700 (hits do not refresh), hit, miss at 7400
    # 2h: miss (lives to 7200), hit, hit, hit, miss at 7400
    rows = [req(p, t) for t in (0, 3_000, 3_700, 5_000, 7_400)]
    r = run(embedder, rows, ttls_s=(HOUR, 2 * HOUR))
    assert cell(r, None, HOUR)["hit_rate_exact"] == pytest.approx(2 / 5)
    assert cell(r, None, 2 * HOUR)["hit_rate_exact"] == pytest.approx(3 / 5)
    assert r["duplicates"]["overall"]["exact_dup_rate"] == pytest.approx(4 / 5)  # no TTL there


def test_analyze__labels_score_false_hits_and_steer_the_threshold(embedder):
    c_false, c_true = cos(embedder, *CONVERT), cos(embedder, *WEATHER)
    low = round(min(c_false, c_true) - 0.01, 4)
    rows = [
        req(CONVERT[0], 0, label="c_to_f"),
        req(CONVERT[1], 10, label="f_to_c"),  # a semantic hit with the wrong answer
        req(WEATHER[0], 20, label="weather"),
        req(WEATHER[1], 30, label="weather"),  # a right one
    ]
    r = run(embedder, rows, thresholds=(low, 1.0), labels="intent")
    c = cell(r, low, HOUR)
    assert (c["hit_rate_semantic"], c["false_hits"], c["false_hit_share"]) == (0.5, 1, 0.5)
    assert cell(r, 1.0, HOUR)["false_hits"] == 0
    assert r["recommendation"]["threshold"] == 1.0  # the only one under 1% wrong answers
    loose = run(embedder, rows, thresholds=(low, 1.0), labels="intent", max_false_share=0.6)
    assert loose["recommendation"]["threshold"] == low
    assert run(embedder, rows)["simulation"][0]["overall"]["false_hits"] is None


@pytest.mark.parametrize(
    ("gaps_s", "ttls_s", "want"),
    [
        ((0, 600, 1_200), (HOUR, DAY), HOUR),  # 1h already saves all that 1d saves
        ((0, 2 * HOUR, 4 * HOUR), (HOUR, DAY), DAY),  # only 1d keeps the entry long enough
        ((0, 10 * DAY), (DAY, 30 * DAY), DAY),  # 30d would outlive the 7d generation keys
    ],
)
def test_analyze__recommended_ttl(embedder, gaps_s, ttls_s, want):
    r = run(embedder, [req(DISTINCT[5], t) for t in gaps_s], thresholds=(0.95,), ttls_s=ttls_s)
    assert r["recommendation"]["ttl_s"] == want
    assert (max(ttls_s) > 7 * DAY) is ("generation keys" in r["recommendation"]["reason"])


def word_salad(n: int, seed: int) -> list[str]:
    rnd = random.Random(seed)
    words = [w for p in DISTINCT for w in p.split()] + ["zebra", "quartz", "violin", "glacier"]
    return [" ".join(rnd.sample(words, 7)) + f" {i}" for i in range(n)]


@pytest.mark.parametrize("repeats", [14, 16])
def test_analyze__verdict_flips_at_fifteen_percent(embedder, repeats):
    prompts = word_salad(100 - repeats, seed=7)
    rows = [req(p, i) for i, p in enumerate(prompts)]
    rows += [req(prompts[i], 1_000 + i) for i in range(repeats)]
    r = run(embedder, rows, thresholds=(0.95,), ttls_s=(DAY,))
    assert r["verdict"]["hit_rate_total"] == pytest.approx(repeats / 100)
    assert r["verdict"]["worth_caching"] is (repeats / 100 >= VERDICT_BAR)


def test_verdict__bar_is_inclusive():
    assert not verdict(np.nextafter(VERDICT_BAR, 0))["worth_caching"]
    assert verdict(VERDICT_BAR)["worth_caching"]


def test_analyze__bad_rows_are_counted_and_skipped(embedder):
    rows = [req(DISTINCT[0], 0), req(DISTINCT[0], 10)]
    broken = [req(DISTINCT[2], 5), req(DISTINCT[3], 6), req(DISTINCT[4], 7)]
    broken[0]["params"] = "{not json"
    broken[1]["tenant"] = ""
    broken[2]["params"] = '{"temperature": -1}'
    r = run(embedder, rows + broken)
    assert r["log"]["rows"] == 5 and r["log"]["requests"] == 2
    assert r["log"]["bad_reasons"] == {"bad_params": 2, "missing_tenant": 1}
    assert cell(r, None, HOUR)["hit_rate_exact"] == 0.5


# --- the CLI, as a user runs it ---------------------------------------------------------------

STOKER = [sys.executable, "-m", "stoker.cli", "analyze"]


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    return subprocess.run([*STOKER, *args], capture_output=True, text=True, timeout=240, env=env)


def write_log(path: Path) -> Path:
    rows = [req(p, 60 * i, tenant="ab"[i % 2], label=f"l{i % 10}") for i, p in enumerate(DISTINCT)]
    rows += [req(p, 900 + i, tenant="ab"[i % 2], label=f"l{i}") for i, p in enumerate(DISTINCT)]
    frame = pd.DataFrame(rows)
    frame["ts"] = frame["ts"].map(lambda t: t.isoformat())
    if path.suffix == ".csv":
        frame.to_csv(path, index=False)
    else:
        path.write_bytes(b"\n".join(orjson.dumps(r) for r in frame.to_dict("records")))
    return path


@pytest.mark.parametrize("suffix", [".jsonl", ".csv"])
def test_cli__json_report_has_a_stable_shape(tmp_path, suffix):
    log = write_log(tmp_path / f"log{suffix}")
    proc = cli(
        str(log), "--json", "--labels", "intent", "--thresholds", "0.9,0.95", "--ttls", "1h,1d"
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    r = orjson.loads(proc.stdout)
    assert set(r) == {"schema", "log", "sample", "settings", "duplicates", "simulation",
                      "recommendation", "verdict", "runtime_s"}  # fmt: skip
    assert r["schema"] == "stoker.analyze/1"
    assert r["log"]["requests"] == 20 and r["log"]["tenants"] == ["a", "b"]
    assert r["settings"]["ttls_s"] == [HOUR, DAY]
    assert [(g["threshold"], g["ttl_s"]) for g in r["simulation"]] == [
        (t, ttl) for t in (None, 0.9, 0.95) for ttl in (HOUR, DAY)
    ]
    stats = r["simulation"][0]["overall"]
    assert set(stats) == {"requests", "hit_rate_exact", "hit_rate_semantic", "hit_rate_total",
                          "hit_rate_total_ci", "gpu_seconds", "gpu_seconds_saved",
                          "gpu_seconds_saved_pct", "false_hits", "false_hit_share"}  # fmt: skip
    assert stats["hit_rate_total_ci"] == [stats["hit_rate_total"]] * 2  # nothing sampled
    assert r["sample"]["sampled"] is False and r["sample"]["distinct_prompts"] == 10
    assert set(r["simulation"][0]["tenants"]) == {"a", "b"}
    assert r["duplicates"]["overall"]["exact_dup_rate"] == 0.5
    assert set(r["recommendation"]) == {"threshold", "ttl_s", "labelled", "reason"}
    assert set(r["verdict"]) == {"worth_caching", "basis", "hit_rate_total", "bar", "text"}


def test_cli__tables_on_the_terminal(tmp_path):
    proc = cli(str(write_log(tmp_path / "log.jsonl")), "--thresholds", "0.95", "--ttls", "1h")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout == ""  # tables go to stderr; stdout is only for --json
    assert "verdict:" in proc.stderr and "unlabelled" in proc.stderr


def test_cli__at_80_columns_in_a_pipe_no_header_or_number_is_cut(tmp_path):
    """Every default threshold and TTL, and --labels: at 80 columns the tables cut `tena…`,
    `24,3…` and `≥0.…`; now a line fits and every word is whole, the widest table split."""
    proc = subprocess.run(
        [*STOKER, str(write_log(tmp_path / "log.jsonl")), "--labels", "intent"],
        capture_output=True, text=True, timeout=240,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "COLUMNS": "80"},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = proc.stderr.splitlines()
    assert not [line for line in lines if len(line) > 80], proc.stderr
    assert "…" not in proc.stderr
    words = proc.stderr.split()
    for whole in ("tenant", "requests", "uncacheable", "≥0.85", "≥0.98", "overall", "GPU"):
        assert whole in words, whole
    for ttl in ("1h", "6h", "1d", "7d"):
        assert ttl in words, ttl
    # the duplicates table went on in a second one: its tenants' rows are there twice
    assert sum(line.startswith("│ overall ") for line in lines) == 3, proc.stderr


@pytest.mark.parametrize(
    "args",
    [["--thresholds", "1.5"], ["--thresholds", "x"], ["--ttls", "0h"], ["--ttls", "1y"],
     ["--labels", "no_such_column"], ["--max-false-share", "2"]],
)  # fmt: skip
def test_cli__bad_arguments_exit_2(tmp_path, args):
    proc = cli(str(write_log(tmp_path / "log.jsonl")), *args)
    assert proc.returncode == 2, proc.stderr[-2000:]


@pytest.mark.parametrize(
    ("name", "content", "says"),
    [("log.parquet", None, "no such file"), ("log.parquet", b"not parquet", "cannot read"),
     ("log.txt", b"{}", "cannot tell the format"),
     ("log.csv", b"ts,prompt\n2026-01-01T00:00:00,hi\n", "lacks required column")],
)  # fmt: skip
def test_cli__unreadable_log_exits_2_with_a_clear_message(tmp_path, name, content, says):
    path = tmp_path / name
    if content is not None:
        path.write_bytes(content)
    proc = cli(str(path))
    assert proc.returncode == 2  # bad input, as for `stoker replay`
    assert says in " ".join(proc.stderr.split())  # rich wraps at 80 columns


def test_cli__over_the_budget_estimates_with_an_interval_and_no_progress_in_json(tmp_path):
    log = write_log(tmp_path / "log.jsonl")
    proc = cli(str(log), "--json", "--embed-budget", "4", "--thresholds", "0.95", "--ttls", "1d")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "embed prompts" not in proc.stderr  # no progress bar with --json
    r = orjson.loads(proc.stdout)
    smp = r["sample"]
    assert smp["sampled"] is True and smp["distinct_prompts"] == 10 and smp["head_prompts"] == 2
    assert smp["embedded_prompts"] < 10
    o = r["simulation"][0]["overall"]
    lo, hi = o["hit_rate_total_ci"]
    assert lo <= o["hit_rate_total"] <= hi and lo < hi
    assert o["requests"] == 20  # rates are over the whole log


def test_cli__tables_say_the_figures_are_estimated(tmp_path):
    proc = cli(str(write_log(tmp_path / "log.jsonl")), "--embed-budget", "4", "--ttls", "1d")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "estimated on a sample" in " ".join(proc.stderr.split())


def test_cli__embeddings_come_from_the_embedding_cache(tmp_path, embedder, redis_url, redis_client):
    from audits.whatif.neighbours import ANALYZE_SCOPE
    from caches.keys import embedding_key, normalise_prompt

    # DISTINCT[0] and [2] are tenant a's, 2 minutes apart; with [2] cached under [0]'s vector,
    # analyze sees a paraphrase at cosine 1.0: proof it read the cache, not the model.
    first, second = (normalise_prompt(DISTINCT[i]) for i in (0, 2))
    vec = embedder.embed([first])[0].astype(np.float32).tobytes()
    redis_client.set(embedding_key(ANALYZE_SCOPE, embedder.id, second), vec)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "STOKER_REDIS_URL": redis_url}
    args = [
        str(write_log(tmp_path / "log.jsonl")),
        "--json",
        "--thresholds",
        "0.99",
        "--ttls",
        "1d",
    ]
    proc = subprocess.run([*STOKER, *args], capture_output=True, text=True, timeout=240, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    sim = orjson.loads(proc.stdout)["simulation"]
    # both of [2]'s requests: a semantic hit writes no entry, so the second is one again
    assert cell({"simulation": sim}, 0.99, DAY)["hit_rate_semantic"] == 0.1
    # ... and it wrote the rest: every distinct prompt is cached now
    scope = embedding_key(ANALYZE_SCOPE, embedder.id, "x").rsplit(":", 1)[0]
    assert len(list(redis_client.scan_iter(match=f"{scope}:*"))) == 10
    proc = cli(*args)  # without the cache: the model's own vectors, no such paraphrase
    assert (
        cell({"simulation": orjson.loads(proc.stdout)["simulation"]}, 0.99, DAY)[
            "hit_rate_semantic"
        ]
        == 0.0
    )
