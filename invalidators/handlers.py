"""Worker handlers: the invalidation worker (kb-changes, invalidations) on the streams contract.

Events the worker cannot carry out are poison, named at decode time so the worker dead-letters
them and applies the rest: an Invalidate by="entity" (no entity index) and an event of a type
that does not belong on these topics. Everything else is applied in offset order; a Redis or
Qdrant outage raises CacheUnavailable (retriable) and the batch comes again, which is safe
because every invalidation is idempotent (invalidation.py).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from confluent_kafka import Message

from invalidators import metrics as M
from invalidators.invalidation import Invalidator
from schemas.errors import EventDecodeError
from schemas.events import Event, Invalidate, KnowledgeBaseChanged, PromptTemplateChanged
from streams.base import Decoded, Handler, Poison

log = logging.getLogger(__name__)

_HANDLED = (KnowledgeBaseChanged, PromptTemplateChanged, Invalidate)


def unsupported_reason(ev: Event) -> EventDecodeError | None:
    """Why this worker must dead-letter an event it decoded, or None if it can apply it."""
    if not isinstance(ev, _HANDLED):
        return EventDecodeError("unexpected_type", f"{ev.type} event on an invalidation topic")
    if isinstance(ev, Invalidate) and ev.by == "entity":
        return EventDecodeError(
            "unsupported_invalidation",
            'by="entity" is not supported (entries keep no entity index); '
            "invalidate by doc or context_hash",
        )
    return None


class InvalidationHandler(Handler):
    """Applies KnowledgeBaseChanged, PromptTemplateChanged and Invalidate events."""

    name = "invalidation"
    topics = ["inference.kb-changes", "inference.invalidations"]  # noqa: RUF012  (the contract)

    def __init__(self, invalidator: Invalidator, *, close_clients: bool = True) -> None:
        self.invalidator = invalidator
        self._close_clients = close_clients  # False when the caller shares its clients

    def decode_batch(self, messages: Sequence[Message]) -> Decoded:
        decoded = super().decode_batch(messages)
        out = Decoded(poison=decoded.poison)
        for ev, msg in zip(decoded.items, decoded.messages, strict=True):
            why = unsupported_reason(ev)
            if why is None:
                out.items.append(ev)
                out.messages.append(msg)
            else:
                out.poison.append(Poison(msg, why))
        return out

    def apply(self, events: list[Event]) -> None:
        """In offset order; a run of KB changes is applied together in 4 round trips, not 4
        per event, which keeps p99 under its 250 ms goal at 1,000 events/s (bench_invalidation:
        invalidation_latency_1000; docs/benchmarks.md, "Invalidation")."""
        run: list[KnowledgeBaseChanged] = []
        for ev in events:
            if isinstance(ev, KnowledgeBaseChanged):
                run.append(ev)
                continue
            self._flush(run)
            self.apply_one(ev)
        self._flush(run)
        self.invalidator.note_changes([e for e in events if isinstance(e, _HANDLED)])
        M.applied(events)

    def _flush(self, run: list[KnowledgeBaseChanged]) -> None:
        if run:
            res = self.invalidator.kb_changed_many(run)
            log.info("kb changes x%d: %s", len(run), res)
            run.clear()

    def apply_one(self, ev: Event) -> None:
        inv = self.invalidator
        if isinstance(ev, KnowledgeBaseChanged):
            res = inv.kb_changed(ev)
            log.info("kb %s/%s v%d: %s", ev.tenant, ev.doc_id, ev.doc_version, res, extra=_ctx(ev))
        elif isinstance(ev, PromptTemplateChanged):
            prog = inv.template_changed(ev)
            log.info(
                "template %s/%s retired: %d deleted",
                ev.tenant,
                ev.old_template_version,
                prog.deleted,
                extra=_ctx(ev) | {"job_id": prog.job_id},
            )
        elif isinstance(ev, Invalidate):
            log.info("invalidate %s %s: %s", ev.by, ev.value, inv.invalidate(ev), extra=_ctx(ev))
        else:  # decode_batch keeps these out; apply() called directly may still pass one
            log.warning("invalidation worker skips a %s event", ev.type)

    def close(self) -> None:
        if self._close_clients:
            self.invalidator.close()


def _ctx(ev: KnowledgeBaseChanged | PromptTemplateChanged | Invalidate) -> dict[str, str]:
    """Structured-log context (stoker.logs): who the event is for, and which event."""
    ctx = {"tenant": ev.tenant, "event_id": ev.event_id}
    version = getattr(ev, "model_version", None)
    if version:
        ctx["model_version"] = version
    return ctx
