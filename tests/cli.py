"""Running the real `stoker` CLI from tests: a subprocess with no STOKER_* from the caller."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path

STOKER = [sys.executable, "-m", "stoker.cli"]


# Where the CLIs a test runs write embedded.json (stoker/embedded_state.py): this run's own
# folder, never the developer's ~/.cache/stoker, where a stack of theirs may be running.
STATE_DIR = Path(tempfile.gettempdir()) / f"stoker-test-state-{os.getpid()}"


def clean_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """This process's environment without STOKER_* (a developer's shell must not leak into a
    test), offline for the embedder, the state folder of this run, plus `extra`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("STOKER_")}
    own = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "STOKER_STATE_DIR": str(STATE_DIR)}
    return env | own | dict(extra or {})


def run_stoker(
    *args: str, env: Mapping[str, str] | None = None, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    """`stoker ARGS` to completion (bounded by timeout), output captured as text."""
    return subprocess.run(
        [*STOKER, *args], env=clean_env(env), capture_output=True, text=True, timeout=timeout
    )
