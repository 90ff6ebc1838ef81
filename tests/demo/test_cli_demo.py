"""`stoker demo` end to end as a user runs it: a subprocess on its own embedded stack."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import orjson
import pytest

from tests.cli import run_stoker


def run(*args: str, timeout: float = 240, **extra_env: str) -> subprocess.CompletedProcess[str]:
    return run_stoker(*args, env=extra_env, timeout=timeout)


@pytest.mark.parametrize("data", ["shipped", "absent"])
def test_smoke__runs_on_embedded_stack_and_keeps_the_invariants(tmp_path: Path, data: str):
    """With the CLINC150 the repository ships, and with STOKER_DATA_DIR pointing where it is
    not (the smoke falls back to built-in phrasings)."""
    out = tmp_path / "demo"
    env = {"STOKER_DATA_DIR": str(tmp_path / "no-data")} if data == "absent" else {}
    proc = run("smoke", "--out", str(out), **env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = orjson.loads((out / "report.json").read_bytes())
    assert report["cross_tenant_hits"] == 0
    assert report["hits_after_invalidation"] == 0
    assert report["stale_writes_refused"] == 1
    assert report["dead_lettered"] == 3
    assert report["outcomes"]["exact"] > 0 and report["outcomes"]["semantic"] > 0
    assert report["requests"] == sum(report["outcomes"].values())


def test_cli__bad_usage_exits_2():
    proc = run("demo", "--no-such-flag")
    assert proc.returncode == 2
    assert "No such option" in proc.stderr


def test_cli__seeds_repeat_the_simulated_run_only():
    """--seeds repeats the simulated run; asked of the live demo, it says so in one line, and
    a count out of range is refused, both before anything starts."""
    proc = run("demo", "--seeds", "2")
    assert proc.returncode == 2 and "add --simulated" in proc.stderr
    assert run("demo", "--simulated", "--seeds", "0").returncode == 2


def test_cli__unknown_command_exits_2():
    assert run("frobnicate").returncode == 2


REPORT_KEYS = {
    "hit_rate_exact", "hit_rate_semantic", "hit_rate_total", "hit_rate_total_baseline",
    "gpu_seconds_saved_pct", "latency_p50_ms", "latency_p99_ms", "warm_requests", "stale_hits",
    "cross_tenant_hits", "false_semantic_hits",
}  # fmt: skip


REGIME_KEYS = {
    "peak_gpu_ratio", "total_gpu_ratio", "warm_efficiency", "post_deploy_gap_points",
    "net_saved_delta_points", "busiest_hours_latency", "expected_saving_gpu_s",
    "realised_saving_gpu_s", "expected_prevented_misses", "verdict", "landed_warms",
    "landed_warms_expected_asked", "landed_warms_hit", "peak_gpu_ratio_bound",
    "replayable_miss_share", "peak_gpu_ratio_bound_frequent", "frequent_miss_share",
    "peak_capture",
}  # fmt: skip


@pytest.mark.timeout(900)  # four passes of the demo's story, ~7 min on 2 loaded cores
def test_demo_fast__warming_beats_baseline_and_nothing_stale_or_crossed(tmp_path: Path) -> None:
    """The main job, short: both passes, a deploy and KB changes, the report and its plots."""
    out = tmp_path / "demo"
    proc = run("demo", "--fast", "--out", str(out), timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]
    report = orjson.loads((out / "report.json").read_bytes())
    assert set(report) >= REPORT_KEYS
    assert report["backend"] == "simulated" and report["regime"] == "ttl_1d"
    assert report["stale_hits"] == 0
    assert report["cross_tenant_hits"] == 0
    assert report["hit_rate_total"] > report["hit_rate_total_baseline"]
    assert report["warm_requests"] > 0
    d = report["deploy"]
    assert d["old_version_keys_left"] == 0 and d["done_counts"]["deleted"] > 0
    # the purge goes in paced batches sized to the namespace, so its plot shows steps
    assert d["done_counts"]["batches"] >= 3, d["done_counts"]
    assert "pre-warmed" in d["ready_detail"]
    assert len(report["kb_changes"]) >= 2
    for png in ("hit_rate.png", "warm_qps.png", "purge_progress.png"):
        assert (out / png).stat().st_size > 10_000
    # both TTL regimes, their TTLs running on the simulated clock: entries do expire, the
    # 3-hour ones many times over in a shorter span
    regimes = report["regimes"]
    assert set(regimes) == {"ttl_1d", "ttl_3h"}
    for name, f in regimes.items():
        assert set(f) >= REGIME_KEYS, name
        assert f["verdict"].startswith(f"{name}: warming ")
        # one headline per regime, printed, saying what its verdict says
        verb = "paid" if f["paid"] else "did not pay"
        assert f"{name}: warming {verb}: " in f["verdict"]
        assert f["headline"].startswith(f"{name} (TTL ") and f"warming {verb}: " in f["headline"]
        assert f"verdict: {f['verdict'][:40]}" in proc.stderr.replace("\n", " ")
        assert (out / f"gpu_demand_{name}.png").stat().st_size > 10_000
        assert len(f["gpu_s_per_hour"]["baseline"]) == f["hours"][1] - f["hours"][0]
        assert 0 <= f["landed_warms_hit"] <= f["landed_warms"] <= f["scheduled_warm_requests"]
        # every scheduled send is accounted for: landed (each matched to its plan item, one
        # prompt in two tenants two entries), refused as stale, or failed
        unlanded = f["warm_refused_stale"] + f["warm_failed"]
        assert f["landed_warms"] + unlanded == f["scheduled_warm_requests"], name
        # and warms land where requests read: the version the gateway serves (with the
        # gateway on "default" and warms on the log's version, the 1-day regime's hit none)
        assert f["landed_warms_hit"] > 0, name
        # the foresight bound: some misses were on requests logged before (a warm could replay
        # them), not all (new questions arrive), so the bound lies strictly inside (0, 1)
        assert 0 < f["replayable_miss_share"] < 1, name
        assert 0 < f["peak_gpu_ratio_bound"] < 1, name
        # fewer misses may move when only the frequent requests' do: never a lower bound
        assert f["frequent_miss_share"] <= f["replayable_miss_share"], name
        assert f["peak_gpu_ratio_bound"] <= f["peak_gpu_ratio_bound_frequent"] <= 1, name
        assert f"no warming could go below {f['peak_gpu_ratio_bound']:.2f}x" in f["verdict"]
    per_hour = {n: f["expired_entries_baseline"] / (f["hours"][1] - f["hours"][0])
                for n, f in regimes.items()}  # fmt: skip
    # (17 an hour against 13 in --fast: the 1-day regime's entries of the first 12 hours run
    # out in its last 12)
    assert per_hour["ttl_3h"] > 1.2 * per_hour["ttl_1d"] > 0


def test_demo__a_broken_invalidation_worker_shows_stale_hits() -> None:
    """Docs are named by id alone, so "stale hits 0" is the invalidation worker's doing, not
    the key scheme's: with a worker that drops KB changes, the scorer must see stale hits."""
    from rich.console import Console

    from demo.progress import DemoProgress
    from demo.run import Embeddings, Pass
    from demo.scenario import Scenario, load_traffic

    # the first 12 hours of the fast run, one KB change at hour 5, no deploy
    sc = replace(Scenario.fast(), week2_hours=12, kb_change_at_h=(5,), deploy_at_h=10**6)
    traffic = load_traffic(sc)
    quiet = DemoProgress(Console(stderr=True, quiet=True))
    res = Pass(sc, traffic, False, quiet, Embeddings(traffic.week2), forgetful_invalidation=True)
    with quiet:
        served = res.run(None).serve
    assert served.stale_hits > 0
    assert served.cross_tenant_hits == 0 and served.errors == 0


def test_cli__start_up_loads_no_model_library():
    """Every `stoker` command, even --help and a bad argument, imports stoker.cli first: the
    libraries that take seconds to import (scikit-learn, torch, sentence-transformers) wait
    for the command that uses them."""
    heavy = ("sklearn", "scipy", "torch", "sentence_transformers", "transformers")
    code = f"import sys, stoker.cli; print([m for m in {heavy!r} if m in sys.modules])"
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert proc.stdout.strip() == "[]"
