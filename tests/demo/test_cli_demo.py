"""`stoker demo` end to end as a user runs it: a subprocess on its own embedded stack."""

from __future__ import annotations

import subprocess
import sys
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


@pytest.mark.timeout(900)
def test_demo_fast__the_story_replayed_with_the_shipped_warming_and_without(tmp_path: Path) -> None:
    """The simulated story, short: two days of week 2 in both TTL regimes through `stoker
    analyze --warming`, a deploy and KB changes, the report, its headlines and plots."""
    out = tmp_path / "demo"
    proc = run("demo", "--fast", "--out", str(out), timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]
    report = orjson.loads((out / "report.json").read_bytes())
    assert report["story"]["hours"] == 48
    assert report["deploy_at"] == "2026-11-10T18:00:00+00:00"  # 42 h into week 2
    changed = {c["at"] for c in report["kb_changes"]}
    assert len(changed) == 2 and len(report["kb_changes"]) >= 4  # 2 docs, each tenant's
    assert report["settings_not_default"] == {}  # shipped defaults, the TTL aside
    regimes = report["regimes"]
    assert set(regimes) == {"ttl_1d", "ttl_3h"}
    for name, f in regimes.items():
        assert len(f["per_hour"]) == 48, name
        # the knowledge-base changes deleted entries built on their documents, in both arms
        assert f["invalidated"] > 0 and f["invalidated_baseline"] > 0, name
        # the deploy's pre-warm ran through the deploy worker's own pre-warmer
        assert "replay-deployed" in f["deploy_prewarm"], name
        assert f["peak_gpu_ratio"] <= 1.0, name  # warming never made the busiest hour busier
        verb = "paid" if f["paid"] else "did not pay"
        assert f"warming {verb}: " in f["headline"]
        assert f["headline"][:50] in proc.stderr.replace("\n", " ")
        assert (out / f"warming_{name}.png").stat().st_size > 10_000
    day = regimes["ttl_1d"]
    assert day["warm_sends"] > 0 and day["hit_rate"] > day["hit_rate_baseline"]
    assert day["total_gpu_ratio"] <= 1.05 and day["warm_efficiency"] >= 0.8


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
