"""The demo off a terminal (CI, a pipe, a log file) says what it does at least every 10 s: one
`stoker demo --fast` run printed nothing for 237 s after its first line."""

from __future__ import annotations

import io
import itertools
import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest
from rich.console import Console

from demo.progress import HEARTBEAT_S, DemoProgress

PROMISE_S = 10.0  # what the help and the docs promise: a line at least this often


class Stamped(io.StringIO):
    """A pipe, not a terminal, that notes when each line was written."""

    def __init__(self) -> None:
        super().__init__()
        self.lines: list[tuple[float, str]] = []
        self._part = ""

    def write(self, s: str) -> int:
        self._part += s
        while "\n" in self._part:
            line, self._part = self._part.split("\n", 1)
            self.lines.append((time.monotonic(), line))
        return len(s)

    def isatty(self) -> bool:
        return False


def _gaps(t0: float, lines: list[tuple[float, str]], t1: float) -> list[float]:
    """Seconds between the start, every line and the end."""
    ts = [t0, *(t for t, _ in lines), t1]
    return [b - a for a, b in itertools.pairwise(ts)]


def test_progress__a_blocked_main_thread_still_prints_a_line_every_interval() -> None:
    out = Stamped()
    console = Console(file=out, width=200)
    assert not console.is_terminal
    blocked = threading.Event()
    t0 = time.monotonic()
    with DemoProgress(console, every_s=0.2) as bar:
        bar.phase("serving week 2")
        task = bar.add_task("hours served", total=36)
        bar.advance(task, 12)
        blocked.wait(1.5)  # the main thread stuck in one long call: nothing else prints
    t1 = time.monotonic()
    assert len(out.lines) >= 5
    assert max(_gaps(t0, out.lines, t1)) < 0.2 * 3  # a late wake-up on a loaded box, not a stop
    assert out.lines[0][1].endswith("serving week 2")  # a new phase prints at once
    assert "serving week 2; hours served 12/36" in out.lines[-1][1]


def test_progress__on_a_terminal_no_heartbeat_thread_runs() -> None:
    console = Console(file=io.StringIO(), force_terminal=True)
    before = {t.name for t in threading.enumerate()}
    with DemoProgress(console, every_s=0.05):
        assert "demo-progress" not in {t.name for t in threading.enumerate()} - before


@pytest.mark.timeout(600)
def test_demo__off_a_terminal_a_line_comes_at_least_every_10_s(tmp_path: Path) -> None:
    """The demo's own path (log, stacks, embedding, week-1 replay, serving, deploy, report,
    plots) on a thin slice: a thirtieth of the traffic, 6 hours of week 2, both regimes."""
    from demo.main import run_demo
    from demo.scenario import Scenario

    assert HEARTBEAT_S <= PROMISE_S / 2  # room for a thread woken late on a loaded machine
    sc = replace(Scenario.fast(), sample_every=30, week2_hours=6, deploy_at_h=4,
                 kb_change_at_h=(2,))  # fmt: skip
    out = Stamped()
    t0 = time.monotonic()
    report = run_demo(tmp_path, sc, "test", Console(file=out, width=200))
    t1 = time.monotonic()
    gaps = _gaps(t0, out.lines, t1)
    worst = max(range(len(gaps)), key=gaps.__getitem__)
    around = [line for _, line in out.lines[max(0, worst - 2) : worst + 1]]
    assert gaps[worst] <= PROMISE_S, (gaps[worst], around)
    text = "\n".join(line for _, line in out.lines)
    # the lines say where the run is: each pass's step, with counts
    for step in ("starting the embedded stack", "embedding week 2's distinct prompts",
                 "replaying week 1", "serving week 2", "writing the report"):  # fmt: skip
        assert step in text, step
    # one headline per regime, printed and in the report, each agreeing with its verdict
    for name, f in report["regimes"].items():
        verb = "did not pay" if "did not pay" in f["verdict"] else "paid"
        assert f"{name} (" in f["headline"] and f"warming {verb}:" in f["headline"]
        assert f["headline"] in text.replace("\n", "") or f["headline"][:60] in text
    for png in ("hit_rate.png", "warm_qps.png", "purge_progress.png", "gpu_demand_ttl_1d.png"):
        assert (tmp_path / png).stat().st_size > 10_000
