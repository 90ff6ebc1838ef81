"""`stoker demo` end to end as a user runs it: a subprocess on its own embedded stack."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import orjson

STOKER = [sys.executable, "-m", "stoker.cli"]


def run(*args: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    env = {k: v for k, v in env.items() if not k.startswith("STOKER_")}
    return subprocess.run([*STOKER, *args], capture_output=True, text=True, timeout=timeout, env=env)


def test_demo__runs_on_embedded_stack_and_keeps_the_invariants(tmp_path: Path):
    out = tmp_path / "demo"
    proc = run("demo", "--out", str(out))
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


def test_cli__unknown_command_exits_2():
    assert run("frobnicate").returncode == 2
