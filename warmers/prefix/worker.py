"""The prefixes worker: counts the prompt prefixes of inference.requests into HotPrefixes.

Its own consumer group on the request log, beside the traffic worker (whose decode path is
tuned for 100k+ events/s and is left alone): a batch is aggregated per (tenant, model), then
written with one script per pair (warmers/prefix/hot.py). Approximate on redelivery, see there.
"""

from __future__ import annotations

import time
from collections import Counter, defaultdict
from collections.abc import Callable

from schemas.events import Event, RequestLogged
from streams.base import Handler
from warmers.prefix.hot import MIN_PREFIX_TOKENS, HotPrefixes, Prefix, prefix_of


class PrefixLogHandler(Handler):
    name = "prefixes"
    topics = ["inference.requests"]  # noqa: RUF012  (the Handler contract: a plain list)

    def __init__(
        self,
        store: HotPrefixes,
        min_tokens: int = MIN_PREFIX_TOKENS,
        clock: Callable[[], float] = time.time,
        *,
        close_clients: bool = True,
    ) -> None:
        """close_clients: False when the caller shares the store's Redis (the shell's Stack)."""
        self.store = store
        self._close_clients = close_clients
        self.min_tokens = min_tokens
        self.clock = clock
        self.counted = 0  # requests whose prefix was counted, for tests and the report

    def apply(self, events: list[Event]) -> None:
        batch: defaultdict[tuple[str, str], Counter[Prefix]] = defaultdict(Counter)
        for ev in events:
            if isinstance(ev, RequestLogged) and (p := prefix_of(ev, self.min_tokens)):
                batch[(ev.tenant, ev.model_id)][p] += 1
        now = self.clock()
        for (tenant, model_id), counts in batch.items():
            self.store.add(tenant, model_id, counts.items(), now)
            self.counted += sum(counts.values())

    def close(self) -> None:
        if self._close_clients:
            self.store.r.close()
