"""Running the real `stoker` CLI from tests: a subprocess with no STOKER_* from the caller."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator, Mapping
from pathlib import Path

STOKER = [sys.executable, "-m", "stoker.cli"]
ROOT = Path(__file__).resolve().parents[1]


# Where the CLIs a test runs, in-process (tests/conftest.py sets STOKER_STATE_DIR to it) or
# not, write and read embedded.json (stoker/embedded_state.py): this run's own folder (one per
# xdist worker), never the developer's ~/.cache/stoker, where a stack of theirs may be running.
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


@contextlib.contextmanager
def running_stoker(
    *args: str, env: Mapping[str, str] | None = None
) -> Iterator[tuple[subprocess.Popen[bytes], list[str]]]:
    """`stoker ARGS` in the background from the repo root, with its stderr lines collected as
    they come; killed at exit if it still runs. Every wait on it is the caller's, bounded."""
    proc = subprocess.Popen([*STOKER, *args], cwd=ROOT, env=clean_env(env),
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)  # fmt: skip
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(x.decode() for x in proc.stderr or []))
    reader.start()
    try:
        yield proc, lines
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        reader.join(10)


def stop(proc: subprocess.Popen[bytes], timeout_s: float = 60) -> int:
    """SIGTERM, as an orchestrator stops a worker, and its exit code (bounded)."""
    proc.send_signal(signal.SIGTERM)
    return proc.wait(timeout_s)
