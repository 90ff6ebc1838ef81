"""The upstream as the gateway last saw it: whether it answers, and the models it lists.

`watch` asks GET <base>/models (Upstream.probe: its own connection, at most PROBE_S) at start
and every `every_s` after, beside serving and never blocking it; a request that cannot reach an
upstream last seen up makes it ask at once. An upstream that answers, whatever the status, is
up; one that does not (refused, reset, no answer within the bound) is down. The state shows in
/readyz's body (`upstream`: unknown until the first answer, then up or down), in
stoker_upstream_up{upstream}, and in the log once per change. Readiness does not follow it: a
gateway whose upstream is down still serves its cached answers, so it stays in rotation.

A model the upstream does not list (in its last good list) is forwarded as asked, since clients
send aliases a server maps (llama-server answers any name with the one model it serves): the
response carries X-Stoker-Warning and the log says so once per model. With strict models it is
a 404 model_not_found instead. Until the upstream has listed its models, none is questioned.
"""

from __future__ import annotations

import asyncio
import logging
from contextlib import suppress
from typing import Literal

from starlette.responses import Response

from gateway import metrics as M
from gateway.errors import ModelNotFound
from gateway.upstream import Probe, Upstream

log = logging.getLogger(__name__)

State = Literal["unknown", "up", "down"]

# Models warned about are remembered so each is logged once; a client can send any name, so the
# memory is bounded (past it the header still says so, the log no longer does).
_WARNED_MAX = 1_000
_MODEL_SHOWN = 100  # characters of a client's model name quoted back in a header


class UpstreamHealth:
    def __init__(self, upstream: Upstream, *, every_s: float, strict_models: bool) -> None:
        self.upstream = upstream
        self.every_s = every_s
        self.strict_models = strict_models
        self.state: State = "unknown"
        self.models: frozenset[str] | None = None  # the last list it answered; None: none yet
        self.probed = ""  # the first check's line, as the start-up log has it
        self.detail = ""  # the last check's line
        self._warned: set[str] = set()
        self._wake = asyncio.Event()
        upstream.when_unreachable(self._unreachable)

    async def watch(self) -> None:
        """Check now, then every `every_s` (at once when a request found the upstream
        unreachable while it was up), until cancelled."""
        while True:
            self._wake.clear()
            self.note(await self.upstream.probe())
            with suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self.every_s)

    def note(self, p: Probe) -> None:
        """What one check found: the state, the gauge, the models; a log line for the first
        check and for each change."""
        state: State = "up" if p.answered else "down"
        self._log(p, state)
        self.state, self.detail = state, p.line
        M.UPSTREAM_UP.labels(upstream=self.upstream.shown).set(1 if state == "up" else 0)
        if p.models is not None:
            models = frozenset(p.models)
            if models != self.models:
                self._warned.clear()  # a model dropped from the list is worth a line again
            self.models = models

    def _log(self, p: Probe, state: State) -> None:
        if not self.probed:
            self.probed = p.line + (
                "" if p.answered
                else "; requests answer 502 until it does (an upstream that starts later is fine)"
            )  # fmt: skip
            log.log(logging.INFO if p.status == 200 else logging.WARNING, "%s", self.probed)
        elif state != self.state and state == "down":
            log.warning("%s; cached answers are still served, misses answer 502", p.line)
        elif state != self.state:
            log.info("%s (back up)", p.line)
        elif p.models is not None and self.models is not None and set(p.models) != self.models:
            log.info("%s (the list changed)", p.line)

    def _unreachable(self) -> None:
        if self.state == "up":
            self._wake.set()

    def vet(self, model: str) -> str | None:
        """None when the upstream lists `model`, or has listed nothing yet; else the warning
        for the response's X-Stoker-Warning header (logged once per model), or ModelNotFound
        with strict models."""
        if self.models is None or model in self.models:
            return None
        shown = _printable(model)
        said = f"model '{shown}' is not listed by the upstream {self.upstream.shown}"
        if self.strict_models:
            raise ModelNotFound(f"{said}, which serves: {_listed(self.models)}")
        if model not in self._warned and len(self._warned) < _WARNED_MAX:
            self._warned.add(model)
            log.warning(
                "%s (it serves: %s); forwarded as asked, as an alias the upstream may map "
                "(strict models refuse it with a 404)",
                said, _listed(self.models),
            )  # fmt: skip
        return said


def warned(response: Response, warning: str | None) -> Response:
    """The response, with X-Stoker-Warning when vet() had one."""
    if warning is not None:
        response.headers["x-stoker-warning"] = warning
    return response


def _printable(model: str) -> str:
    """A client's model name as a header may carry it: printable ASCII, bounded."""
    shown = "".join(c if " " <= c <= "~" else "?" for c in model[:_MODEL_SHOWN])
    return shown + ("..." if len(model) > _MODEL_SHOWN else "")


def _listed(models: frozenset[str]) -> str:
    """At most five of the listed models, for a line."""
    names = sorted(models)
    more = f" and {len(names) - 5} more" if len(names) > 5 else ""
    return ", ".join(names[:5]) + more if names else "none"
