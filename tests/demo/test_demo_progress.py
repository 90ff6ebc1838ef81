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


def test_progress__a_long_status_wraps_between_words_at_80_columns() -> None:
    """Off a terminal a status line of 81+ characters was one line, soft-wrapped mid-word by
    whatever showed it: it now wraps at the console's width, indented past the clock."""
    out = Stamped()
    with DemoProgress(Console(file=out, width=80), every_s=60) as bar:
        bar.add_task("serving the day's requests through the gateway", total=1_234)
        bar.add_task("warming the hot set for the coming window", total=56)
        bar.phase("the live day on SmolLM2-135M-Instruct behind the embedded gateway")
    lines = [line for _, line in out.lines]
    assert len(lines) >= 2 and all(len(line) <= 80 for line in lines), lines
    assert all(line.startswith(" " * 10) and line[10] != " " for line in lines[1:]), lines
    said = " ".join(" ".join(lines).split())
    assert (
        "SmolLM2-135M-Instruct" in said and "warming the hot set for the coming window 0/56" in said
    )


def test_progress__on_a_terminal_no_heartbeat_thread_runs() -> None:
    console = Console(file=io.StringIO(), force_terminal=True)
    before = {t.name for t in threading.enumerate()}
    with DemoProgress(console, every_s=0.05):
        assert "demo-progress" not in {t.name for t in threading.enumerate()} - before


@pytest.mark.timeout(600)
def test_demo__off_a_terminal_a_line_comes_at_least_every_10_s(tmp_path: Path) -> None:
    """The simulated demo's own path (log, history, both regimes' replays, report, plots) on
    six hours of week 2."""
    from demo.simulated.main import run_demo
    from demo.simulated.story import Scenario

    assert HEARTBEAT_S <= PROMISE_S / 2  # room for a thread woken late on a loaded machine
    sc = replace(Scenario.fast(), hours=6, deploy_at_h=4, kb_change_at_h=(2,))
    out = Stamped()
    t0 = time.monotonic()
    report = run_demo(tmp_path, sc, Console(file=out, width=200))
    t1 = time.monotonic()
    gaps = _gaps(t0, out.lines, t1)
    worst = max(range(len(gaps)), key=gaps.__getitem__)
    around = [line for _, line in out.lines[max(0, worst - 2) : worst + 1]]
    assert gaps[worst] <= PROMISE_S, (gaps[worst], around)
    text = "\n".join(line for _, line in out.lines)
    # the lines say where the run is: the phase, and a regime's replay with its share done
    assert "replaying 6 hours of week 2" in text
    assert "TTL 1d, with warming" in text or "TTL 3h, with warming" in text
    for f in report["regimes"].values():
        assert f["headline"][:60] in text
    assert (tmp_path / "warming_ttl_1d.png").stat().st_size > 10_000
