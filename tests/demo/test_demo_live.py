"""The live demo end to end on the real model: a tiny day (two tenants, short system prompts,
about 40 requests of 4 intents) through the gateway in front of llama-server, a KB change and a
deploy with its restart, TTFT probes and pre-warm; the report's invariants, and that each check
met something to check. ~1 min on an idle 2-core box, ~4 under load."""

from __future__ import annotations

import io
from pathlib import Path

import orjson
import pytest
from rich.console import Console

from demo.live.main import run_live_demo
from demo.live.report import OUTCOMES
from demo.live.scenario import LiveScenario, load_live_traffic


@pytest.mark.timeout(600)
def test_live_demo__tiny_day_on_the_real_model_keeps_its_invariants(tmp_path: Path):
    out = tmp_path / "live"
    said = io.StringIO()
    sc = LiveScenario.tiny()
    report = run_live_demo(out, sc, Console(file=said, width=80))  # a pipe's width

    assert report["simulated"] is False
    c = report["correctness"]
    assert c["hits"] > 0  # the slice's intents repeat their questions all day
    assert (c["crossed"], c["unattributed"], c["retired"]) == (0, 0, 0)
    assert c["stale_after_invalidation_applied"] == 0
    # each check had something to check: none of the zeros above is vacuous
    k = c["checked"]
    assert k["hits_on_changed_articles_after_kb_change"] > 0  # the stale check's
    assert k["hits_after_cutover"] > 0  # the retired check's
    assert k["semantic_hits_scored"] > 0  # the false-hit check's
    assert report["semantic_hits_scored"] == k["semantic_hits_scored"]
    assert report["false_semantic_hits"]["false"] <= report["semantic_hits_scored"]

    day = report["hit_rates"]["day"]
    # every request of the slice is served once and counted once
    assert day["requests"] == report["day"]["requests"] == len(load_live_traffic(sc).day)
    assert sum(day[o] for o in OUTCOMES) == day["requests"]
    assert day["exact"] + day["semantic"] == c["hits"]
    per_tenant = report["hit_rates"]["per_tenant"]
    assert sum(t["requests"] for t in per_tenant.values()) == day["requests"]
    assert sum(h["requests"] for h in report["hit_rates"]["by_hour"]) == day["requests"]

    b = report["backend_seconds"]
    # every answered request is in the gateway's request log, and the log's gpu_ms of the
    # misses is the server's own timings as the ledger saw them
    assert b["request_log_events"] == day["requests"] - day["error"]
    assert b["request_log_gpu_s"] == pytest.approx(b["by_source_s"]["live"], abs=0.2)
    assert b["by_source_s"]["live"] > 0 and b["by_source_s"]["prefix"] > 0

    t = report["ttft_after_deploy"]
    for arm in ("cold", "prefix_warmed"):
        assert t[arm]["n"] == t[arm]["answered"] == 4
        assert 0 < t[arm]["p50_ms"] <= t[arm]["p99_ms"]
    assert t["prefix_warm"]["warmed"] > 0 and t["prefix_warm"]["failed"] == 0

    d = report["deploy"]
    assert d["to"] == "2026-11-10" and d["old_version_keys_left"] == 0
    assert report["kb_change"]["applied_after_ms"] > 0

    on_disk = orjson.loads((out / "report.json").read_bytes())
    assert on_disk["correctness"]["crossed"] == 0
    for name in (
        "summary.txt",
        "hit_rate_live.png",
        "ttft_after_deploy.png",
        "backend_seconds.png",
    ):
        assert (out / name).stat().st_size > 0
    lines = (out / "generations.jsonl").read_bytes().splitlines()
    assert len(lines) == sum(b["calls"].values())
    printed = said.getvalue()
    assert "no figure below rests on the simulator" in " ".join(printed.split())
    # the summary, printed and in summary.txt, and the progress lines fit 80 columns whole
    summary = (out / "summary.txt").read_text()
    assert summary.strip() in printed
    lines = printed.splitlines()
    assert f"report: {out / 'report.json'}" in lines  # a path whole on its line, however long
    paths = [ln for ln in lines if ln.startswith(("report: /", "plot: /"))]
    too_wide = [ln for ln in lines if len(ln) > 80 and ln not in paths]
    assert not too_wide, too_wide
    words = summary.split()
    assert "SmolLM2-135M-Instruct" in words
    # the ambiguous hits, once each, and the checks' counts said to overlap
    assert f"ambiguous, not counted as wrong: {c['ambiguous']} of the {c['hits']} hits" in (
        " ".join(words)
    )
    assert "overlapping" in words and c["ambiguous"] <= c["hits"]
