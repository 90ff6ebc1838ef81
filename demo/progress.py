"""The demo's progress: rich's live bars on a terminal, a plain line every few seconds elsewhere.

Off a terminal (CI, `make demo > log`, a test's pipe) rich draws no live display at all, so a
demo whose every step reports through bars said nothing for minutes (docs/demo.md). Here a
heartbeat thread prints what runs, with its count, at least every `every_s` seconds, whatever
the main thread is blocked on (a stack starting, the embedding model loading, a wait on a
worker).
"""

from __future__ import annotations

import textwrap
import threading
import time
from typing import Any

from rich.console import Console
from rich.progress import Progress

# A line at least this often off a terminal. The promise is one every 10 s; 5 s leaves room for
# a thread woken late on a loaded 2-core machine.
HEARTBEAT_S = 5.0
_CLOCK = len("[    0 s] ")  # the status line's head


class DemoProgress(Progress):
    """One for the whole demo: passes add their tasks to it, `phase` names the step between."""

    def __init__(self, console: Console, every_s: float = HEARTBEAT_S) -> None:
        live = console.is_terminal
        super().__init__(console=console, transient=True, disable=not live)
        self.every_s = every_s
        self._phase = self._detail = ""
        self._phase_task = self.add_task("", total=None, visible=live)
        self._t0 = time.monotonic()
        self._last = 0.0  # monotonic time of the last heartbeat line
        self._stop = threading.Event()
        self._beat: threading.Thread | None = None
        if not live:
            self._beat = threading.Thread(target=self._run, name="demo-progress", daemon=True)

    def phase(self, text: str) -> None:
        """The step the demo is in; off a terminal it is printed at once."""
        self._phase, self._detail = text, ""
        self.update(self._phase_task, description=text)
        if self._beat is not None:
            self._line()

    def detail(self, text: str) -> None:
        """Where in the step it is (an hour, a warm): shown with the next line, not printed at
        once, so a step of many small parts does not print one line each."""
        self._detail = text
        self.update(self._phase_task, description=f"{self._phase} ({text})")

    def start(self) -> None:
        super().start()
        self._t0 = self._last = time.monotonic()
        if self._beat is not None and not self._beat.is_alive():
            self._beat.start()

    def stop(self) -> None:
        self._stop.set()
        if self._beat is not None and self._beat.is_alive():
            self._beat.join(self.every_s + 1)
        super().stop()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def status_line(self) -> str:
        """What runs now: the phase, then each open task with its count."""
        phase = f"{self._phase} ({self._detail})" if self._detail else self._phase
        parts = [phase] if phase else []
        for t in self.tasks:
            if t.id == self._phase_task or t.finished or not t.description:
                continue
            count = f"{t.completed:,.0f}" + (f"/{t.total:,.0f}" if t.total is not None else "")
            parts.append(f"{t.description} {count}")
        return f"[{time.monotonic() - self._t0:5.0f} s] " + ("; ".join(parts) or "working")

    def _line(self) -> None:
        """The status line wrapped between words to the console's width (80 in a pipe), its
        lines after the first indented past the clock."""
        self._last = time.monotonic()
        wrap = textwrap.TextWrapper(self.console.width, subsequent_indent=" " * _CLOCK,
                                    break_long_words=False, break_on_hyphens=False)  # fmt: skip
        text = wrap.fill(self.status_line())
        self.console.print(text, highlight=False, soft_wrap=True, markup=False)

    def _run(self) -> None:
        while not self._stop.wait(max(0.0, self._last + self.every_s - time.monotonic())):
            if time.monotonic() >= self._last + self.every_s:
                self._line()
