"""The prefix warm after a replica restart or a scale-out, found by watching the replicas.

A deploy's prefix warm is sent by the cutover (warmers/prefix/warm.py). A replica that restarts
later (an OOM kill, a node drained, a scale-out) comes back with an empty KV prefix cache, and
nothing told stoker. A postStart hook in the replica's pod could call `stoker warm-prefixes`,
but that puts stoker in the inference image. Instead, the scheduler's leader reads each listed
replica's engine (backends/engine.py: its /metrics, all replicas at once, each within
`timeout_s`) every `check_s` and warms a replica's prefixes when its cache must be empty:
- what the engine shows (backends/engine.py, `restarted`): its process start time moved
  (vLLM exports it); a counter of work done went back (prompt and generated tokens, decode
  calls: llama.cpp exports no start time, and its counters reset only with the process); or,
  the first time it is seen, it has prefilled nothing (a new replica). A replica first seen
  with traffic behind it is left alone, so a new leader (a failover, a rollout of stoker) does
  not re-warm the whole fleet;
- what only a watch sees: it stopped answering and answers again. A llama-server is back
  within seconds of a restart, and traffic in those seconds can carry its counters past where
  they were by the next check; a replica that was only unreachable for a while costs a warm
  of prefixes it still holds, a token or two each.
A replica that does not answer keeps what was last seen, so its restart shows once it answers.
Its warm goes to that replica alone, with the model's hot prefixes (the prefix warmer's
budget, sized to that replica's cache).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from backends.engine import EngineReader, EngineState, restarted

log = logging.getLogger(__name__)

CAME_BACK = "restarted: it stopped answering and answers again"


@dataclass
class ReplicaWatch:
    """The scheduler's job: call it every `check_s` (leader only), from a thread that runs no
    event loop."""

    replicas: Mapping[str, Sequence[str]]  # model id -> replica base URLs
    warm: Callable[[str, str], object]  # (model id, replica URL) -> the prefix warm's report
    timeout_s: float = 5.0
    seen: dict[str, EngineState] = field(default_factory=dict)  # url -> last state read
    silent: set[str] = field(default_factory=set)  # seen once, not answering since
    _readers: dict[str, EngineReader] = field(default_factory=dict, repr=False)

    def __call__(self) -> list[tuple[str, str, str]]:
        """Read every replica; warm those whose prefix cache is empty: (model, url, why)."""
        states = asyncio.run(self._read_all())
        warmed = []
        for model, urls in self.replicas.items():
            for url in urls:
                why = self._why(url, states.get(url))
                if why is None:
                    continue
                report = self.warm(model, url)
                log.info("prefix warm of %s at %s (%s): %s", model, url, why, report)
                warmed.append((model, url, why))
        return warmed

    def _why(self, url: str, now: EngineState | None) -> str | None:
        """Why the replica at `url` needs a warm now, remembering what was read."""
        if now is None:
            if url in self.seen:
                self.silent.add(url)
            log.debug("replica %s did not answer /metrics", url)
            return None
        why = restarted(self.seen.get(url), now)
        if why is None and url in self.silent:
            why = CAME_BACK
        self.silent.discard(url)
        self.seen[url] = now
        return why

    async def _read_all(self) -> dict[str, EngineState | None]:
        urls = list(dict.fromkeys(u for us in self.replicas.values() for u in us))
        for u in urls:
            if u not in self._readers:
                self._readers[u] = EngineReader(u, timeout_s=self.timeout_s)
        readers = [self._readers[u] for u in urls]
        try:
            got = await asyncio.gather(*(r.read() for r in readers))
        finally:  # the connections belong to this loop: closed with it
            await asyncio.gather(*(r.aclose() for r in readers))
        return dict(zip(urls, got, strict=True))
