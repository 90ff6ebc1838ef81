"""The re-warm after a KB change: the hot entries a changed document took away, warmed again with
its new text, paced.

The rewarm worker reads inference.kb-changes in a consumer group of its own. For each update
that carries the document's new text (KnowledgeBaseChanged v2), in a batch:
1. wait until the invalidation worker has applied it (the doc's floor is at the event's
   version): a warm sent earlier would be deleted as stale, or refused. Not applied within
   `wait_s`, the batch raises InvalidationPending: the worker backs off and reads it again, so
   nothing is lost while the invalidation worker catches up;
2. keep the text, and the text it replaced, per document (warmers/hotset/renew.py);
3. plan the coming hours (the hour under way and `hours` - 1 more) for the requests that
   named a changed document, by the warmer's own rules: what the profile expects asked more
   than its send costs (valued by hits, as the deploy pre-warm: a change empties a document's
   entries at once, as a deploy empties a version), not cached already. The planner renews each logged request
   with the new text (warmers/hotset/select.py: _renew_changed_docs) and says why it could not;
4. send them through the shadow warmer, at the warm QPS and backing off on 429s.
Retracted and deleted documents, and updates without a text, are not re-warmed: the next live
request decides what the retriever now returns.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from pydantic import BaseModel, ConfigDict, Field

from caches import keys as K
from caches import slots
from caches.boundary import redis_boundary
from schemas.errors import RetriableError
from schemas.events import Event, KnowledgeBaseChanged
from streams.base import Handler
from warmers.hotset.plan import Plan
from warmers.hotset.renew import DocTexts
from warmers.hotset.value import ValueModel
from warmers.hotset.warm_budget import Budget
from warmers.hotset.window import Window
from warmers.runner import WarmRunner, outcome
from warmers.shadow import WarmSummary

log = logging.getLogger(__name__)


class InvalidationPending(RetriableError):
    """A KB change the invalidation worker has not applied yet; its re-warm must wait."""


class RewarmOptions(BaseModel):
    """The owner of the rewarm_* settings' defaults and bounds (stoker/options.py)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    budget_requests: int = Field(default=200, ge=0)  # warm sends per batch of changes at most
    # the hour under way and the next: a change at :50 still warms what follows
    hours: int = Field(default=2, ge=1, le=24)
    # for the invalidation worker, before the batch is read again
    wait_s: float = Field(default=30.0, gt=0, le=3_600)
    poll_s: float = Field(default=0.2, gt=0)
    # "hits", as the deploy pre-warm: a change empties a document's entries all at once, as a
    # deploy empties a version, and what is expected asked more than once pays its send. By
    # "prevented", only what the load's rise before the window pays for is sent (value.py).
    value_model: ValueModel = "hits"

    @property
    def budget(self) -> Budget:
        return Budget(requests=self.budget_requests)


class RewarmHandler(Handler):
    name = "rewarm"
    topics = ["inference.kb-changes"]  # noqa: RUF012  (the contract)
    batch_size = 500  # each batch is one plan and one paced run

    def __init__(
        self,
        runner: WarmRunner,
        options: RewarmOptions | None = None,
        *,
        window: Callable[[], Window] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.runner = runner
        self.opts = options or RewarmOptions()
        self.texts = DocTexts(runner.cache.redis)
        self.window = window or (lambda: Window.from_this_hour(self.opts.hours))
        self._clock = clock
        self.last: WarmSummary | None = None  # the last batch's run, for `report` and tests

    def apply(self, events: list[Event]) -> None:
        updates = [
            e for e in events
            if isinstance(e, KnowledgeBaseChanged) and e.change == "updated" and e.text is not None
        ]  # fmt: skip
        if not updates:
            return
        self._wait_applied(updates)
        for ev in updates:
            assert ev.text is not None  # filtered above
            self.texts.note(ev.tenant, ev.doc_id, ev.doc_version, ev.text, ev.previous_text)
        docs = {(e.tenant, e.doc_id) for e in updates}
        plan = self.runner.plan(
            self.window(), self.opts.budget, tenants=sorted({t for t, _ in docs}), docs=docs,
            value_model=self.opts.value_model,
        )  # fmt: skip
        self.last = summary = self.runner.warm(plan, labels={"by": "rewarm"})
        log.info("%s", said(len(updates), plan, summary))

    def _wait_applied(self, updates: list[KnowledgeBaseChanged]) -> None:
        """Until every update's floor is at its version (the invalidation worker raised it and
        deleted what was built on older text); InvalidationPending after `wait_s`."""
        keys = [K.doc_floor_key(e.tenant, e.doc_id) for e in updates]
        deadline = self._clock() + self.opts.wait_s
        while True:
            with redis_boundary("re-warm floors"):
                floors = slots.mget(self.runner.cache.redis, keys)
            pending = [e for e, f in zip(updates, floors, strict=True)
                       if int(f or 0) < e.doc_version]  # fmt: skip
            if not pending:
                return
            if self._clock() >= deadline:
                e = pending[0]
                raise InvalidationPending(
                    f"{len(pending)} KB changes not applied by the invalidation worker after "
                    f"{self.opts.wait_s:.0f} s (first: {e.tenant}/{e.doc_id} v{e.doc_version}); "
                    "is it running?"
                )
            time.sleep(self.opts.poll_s)


def said(changes: int, plan: Plan, summary: WarmSummary) -> str:
    """A batch's re-warm for a person: what was planned, what was left out and why, and what
    the sends did."""
    left = plan.left_out()
    return (
        f"re-warm after {changes} KB change{'' if changes == 1 else 's'}: "
        f"{len(plan.items)} planned, {len(plan.skipped)} left out"
        + (f" ({left})" if left else "")
        + f"; {outcome(summary)[1]}"
    )
