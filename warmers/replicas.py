"""The prefix warm after a replica restart or a scale-out, found by watching the replicas.

A deploy's prefix warm is sent by the cutover (warmers/prefixwarm.py). A replica that restarts
later (an OOM kill, a node drained, a scale-out) comes back with an empty KV prefix cache, and
nothing told stoker. A postStart hook in the replica's pod could call `stoker warm-prefixes`,
but that puts stoker in the inference image. Instead, the scheduler's leader reads each listed
replica's /metrics every `check_s` and warms a replica's prefixes when its cache must be empty:
- its process start time moved (`process_start_time_seconds`, which vLLM exports through the
  Prometheus client's process collector): it restarted;
- or its prefix-cache query counter (`vllm:prefix_cache_queries_total`) went down: a counter
  reset, which is a restart too where no start time is exported;
- or, the first time it is seen, that counter is 0: it has prefilled nothing yet (a new
  replica). A replica first seen with traffic behind it is left alone, so a new leader (a
  failover, a rollout of stoker) does not re-warm the whole fleet.
A replica that does not answer keeps what was last seen, so its restart shows once it answers.
Its warm goes to that replica alone, with the model's hot prefixes (the prefix warmer's
budget, sized to that replica's KV cache).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import httpx

from schemas.baseurl import BaseURL
from warmers.promtext import samples

log = logging.getLogger(__name__)

_START = "process_start_time_seconds"
_QUERIES = "vllm:prefix_cache_queries_total"


@dataclass(frozen=True)
class ReplicaState:
    started: float | None  # process start, unix seconds
    queries: float | None  # prefix-cache queries so far (tokens), summed over label sets


def replica_state(metrics: str) -> ReplicaState:
    """What a replica's Prometheus text says of its process start and prefix-cache use."""
    got = samples(metrics, (_START, _QUERIES))
    starts, queries = got.get(_START), got.get(_QUERIES)
    return ReplicaState(max(starts) if starts else None, sum(queries) if queries else None)


def emptied(before: ReplicaState | None, now: ReplicaState) -> str | None:
    """Why the replica's prefix cache must be empty now (module docstring), or None."""
    if before is None:
        return "a new replica: it has prefilled nothing yet" if now.queries == 0 else None
    if now.started is not None and before.started is not None and now.started != before.started:
        return "restarted: its process start time moved"
    if now.queries is not None and before.queries is not None and now.queries < before.queries:
        return "restarted: its prefix-cache counter went back"
    return None


@dataclass
class ReplicaWatch:
    """The scheduler's job: call it every `check_s` (leader only)."""

    replicas: Mapping[str, Sequence[str]]  # model id -> replica base URLs
    warm: Callable[[str, str], object]  # (model id, replica URL) -> the prefix warm's report
    timeout_s: float = 5.0
    seen: dict[str, ReplicaState] = field(default_factory=dict)  # url -> last state

    def __call__(self) -> list[tuple[str, str, str]]:
        """Read every replica; warm those whose prefix cache is empty: (model, url, why)."""
        warmed = []
        for model, urls in self.replicas.items():
            for url in urls:
                now = self._read(url)
                if now is None:
                    continue
                why = emptied(self.seen.get(url), now)
                self.seen[url] = now
                if why is None:
                    continue
                report = self.warm(model, url)
                log.info("prefix warm of %s at %s (%s): %s", model, url, why, report)
                warmed.append((model, url, why))
        return warmed

    def _read(self, url: str) -> ReplicaState | None:
        try:
            resp = httpx.get(BaseURL.parse(url).server("metrics"), timeout=self.timeout_s)
        except httpx.HTTPError as e:
            log.debug("replica %s did not answer /metrics: %s", url, e)
            return None
        if resp.status_code != 200:
            log.debug("replica %s answered /metrics with %d", url, resp.status_code)
            return None
        return replica_state(resp.text)
