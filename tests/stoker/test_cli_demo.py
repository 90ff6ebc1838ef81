"""`stoker demo` end to end as a user runs it: a subprocess on its own embedded stack."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

STOKER = [sys.executable, "-m", "stoker.cli"]


def run(*args: str, timeout: float = 240, **extra_env: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("STOKER_")}
    env |= {"HF_HUB_OFFLINE": "1", **extra_env}
    return subprocess.run(
        [*STOKER, *args], capture_output=True, text=True, timeout=timeout, env=env
    )


@pytest.mark.parametrize("data", ["shared", "absent"])
def test_demo__runs_on_embedded_stack_and_keeps_the_invariants(tmp_path: Path, data: str):
    """With ../shared (CLINC150) and without it (a user's fresh clone: built-in phrasings)."""
    out = tmp_path / "demo"
    env = {"STOKER_DATA_DIR": str(tmp_path / "no-data")} if data == "absent" else {}
    proc = run("demo", "--out", str(out), **env)
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
