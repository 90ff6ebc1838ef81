"""The shadow warmer's guard over a backend's engine: warm only into room live traffic leaves.

The AIMD controller (throttle.py) learns of a full backend from the warm's own answers: late
ones, 429s. A small server has no room to learn in. llama-server with 2 slots on one core
shares every decode step between the requests in its slots, and a third request waits for one
(`llamacpp:requests_deferred`): one warm in the way of a burst costs a live request a whole
answer's wait. The engine says it at once (backends/engine.py), so the guard reads it every
`interval_s` and:
1. holds a send while the other traffic's share of the slots (busy slots less the warm's own
   sends in flight) is at or over `busy`, while any request waits for a slot, and while the
   send would take the last free slot (the warm holds at most slots - 1, at least one); an
   item held longer than `hold_max_s` is not sent (the run goes on with the next);
2. while sends are in flight, makes way when the other traffic comes back: at or over `busy`
   (a live request arrived; on one core it would share every decode step with the warm), or a
   request waiting for a slot. The warm's sends are cancelled (their connections closed:
   llama-server and vLLM stop a request whose client went away, llama-server at the next token
   of a streamed one, as warm runs send them); a wait for a slot also cuts the AIMD rate once,
   as a 429 does. A cancelled warm is work lost on an engine that was idle when it started;
   the next run sends it again.
An engine that reports no slots (vLLM: its KV share prices sends instead, shadow.py) is held
only by requests waiting, which vLLM reports as num_requests_waiting.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from backends.engine import EngineReader, EngineState
from backends.pacing import Clock

# go: room for one more send; crowded: the other traffic holds `busy` of the slots; full: the
# warm's own sends hold all it may; deferred: another request waits for a slot.
Verdict = Literal["go", "crowded", "full", "deferred", "unknown"]


@dataclass(frozen=True)
class GuardConfig:
    """`busy`: the other traffic's share of the slots at which the warm holds (0.5: one of
    llama-server's 2 slots); `interval_s`: how often the engine is read (its /metrics, ~1 ms
    of a llama-server's time); `hold_max_s`: how long one item waits for room."""

    busy: float = 0.5
    interval_s: float = 0.25
    hold_max_s: float = 60.0

    def __post_init__(self) -> None:
        if not 0.0 < self.busy <= 1.0:
            raise ValueError(f"engine busy share {self.busy} must lie in (0, 1]")
        if self.interval_s <= 0 or self.hold_max_s <= 0:
            raise ValueError("engine interval_s and hold_max_s must be > 0")


def verdict(state: EngineState | None, own: int, busy: float) -> Verdict:
    """What the engine's state says of one more warm send, `own` of the warm's in flight."""
    if state is None:
        return "unknown"  # no /metrics: the answers alone pace the warm (AIMD)
    if state.waiting is not None and state.waiting > 0:
        if state.running is None:
            return "deferred"  # whose they are is not said: the live traffic's, to be safe
        others = state.running + state.waiting - own
        return "deferred" if others > 0 else "full"  # only the warm's own: hold, no cut
    if state.running is not None and state.slots:
        if max(0.0, state.running - own) / state.slots >= busy:
            return "crowded"
        # never the last free slot: a live request arriving finds it (one slot of one)
        return "full" if own >= max(1, state.slots - 1) else "go"
    return "go"


class EngineGuard:
    """Step 1 (`room`) and step 2 (`watch`) of the module docstring, for one warm run."""

    def __init__(
        self,
        reader: EngineReader,
        config: GuardConfig,
        clock: Clock,
        in_flight: Callable[[], int],
    ) -> None:
        self.reader, self.cfg, self.clock, self.in_flight = reader, config, clock, in_flight
        self.held_s = 0.0  # time sends waited for room

    async def room(self) -> bool:
        """Wait until the engine has room for one more send; False after hold_max_s."""
        start = self.clock.now()
        try:
            while True:
                v = verdict(await self.reader.latest(), self.in_flight(), self.cfg.busy)
                if v in ("go", "unknown"):
                    return True
                if self.clock.now() - start >= self.cfg.hold_max_s:
                    return False
                await self.clock.sleep(self.cfg.interval_s)
        finally:
            self.held_s += self.clock.now() - start

    async def watch(self, make_way: Callable[[], int], on_deferred: Callable[[], None]) -> None:
        """Until cancelled: while the warm has sends in flight and the other traffic is back
        (crowded, or deferred), `make_way` (cancel them; how many); when a request waited for
        a slot and some were cancelled, `on_deferred` (cut the rate)."""
        while True:
            await self.clock.sleep(self.cfg.interval_s)
            own = self.in_flight()
            if own == 0:
                continue
            v = verdict(await self.reader.read(), own, self.cfg.busy)
            if v in ("crowded", "deferred") and make_way() and v == "deferred":
                on_deferred()

    async def aclose(self) -> None:
        await self.reader.aclose()
