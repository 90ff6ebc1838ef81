"""A deploy cutover's job document, its options, the pre-warm contract and the supersede rules.

The rules themselves (duplicates, newer deploys, rollbacks) are told in cutover.py's docstring;
this module holds the data they act on, so the runner there stays about the phases.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Any, Literal, Protocol

import orjson
from pydantic import BaseModel, ConfigDict, Field

from invalidators.purge import PurgeOptions, PurgeSpec
from schemas.events import ModelDeployed
from schemas.prewarm import PrewarmRequest

Phase = Literal["prewarm", "grace", "retire", "purge", "done", "failed"]
TERMINAL = ("done", "failed")


class PrewarmReport(Protocol):
    """What the cutover reads of a pre-warm (warmers.prewarm.HotSetPrewarm has more). `ok` is
    the pre-warm's own verdict on its bar: READY is published only when it holds."""

    @property
    def warmed(self) -> int: ...

    @property
    def failed(self) -> int: ...

    @property
    def detail(self) -> str: ...

    @property
    def ok(self) -> bool: ...


@dataclass(frozen=True)
class PrewarmOutcome:
    """The smallest PrewarmReport; `skipped` with a detail when there was nothing to warm with."""

    warmed: int = 0
    failed: int = 0
    skipped: bool = False
    detail: str = ""
    ok: bool = True


class Prewarmer(Protocol):
    """Warms V's namespace with the hot set of the coming window (warmers.prewarm's
    HotSetPrewarmer). Must be safe to run twice: a restart during the pre-warm runs it again."""

    def prewarm(self, req: PrewarmRequest) -> PrewarmReport: ...


class NoPrewarmer:
    """The default until a warmer is configured: skips, and says so in the job's detail."""

    def prewarm(self, req: PrewarmRequest) -> PrewarmOutcome:
        return PrewarmOutcome(skipped=True, detail="skipped: no warmer configured")


class CutoverOptions(BaseModel):
    """The owner of deploy_grace_s's default and bounds (stoker/options.py)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    # default grace window; ModelDeployed.grace_s overrides it
    grace_s: int = Field(default=86_400, ge=0)
    purge: PurgeOptions = Field(default_factory=PurgeOptions)
    # Retriable failures of one job before it is failed; back-off doubles from retry_s.
    max_attempts: int = Field(default=5, ge=1)
    retry_s: float = Field(default=2.0, gt=0)
    # At most one progress JobStatus per this many seconds during the purge: a 1M-key purge
    # has 1,000 batches, and stoker.status is for people and CI, not a metrics stream.
    status_every_s: float = Field(default=0.5, ge=0)


@dataclass
class DeployJob:
    """The job document saved in Redis (checkpoint key of deploy_job_id(deploy_id))."""

    deploy_id: str
    model_id: str
    version: str
    previous_version: str | None
    tenants: list[str] | None
    grace_s: int
    phase: Phase = "prewarm"
    grace_until: float | None = None
    prewarm: str = ""
    detail: str = ""
    attempts: int = 0
    purge_ids: list[str] = field(default_factory=list)
    purges_done: int = 0
    counts: dict[str, int] = field(default_factory=dict)
    # One record per purge run: where it resumed ({node: cursor}) and what it deleted.
    purge_runs: list[dict[str, Any]] = field(default_factory=list)
    accepted_at: float = field(default_factory=time.time)
    superseded_by: str | None = None  # the newer deploy that ended this job's grace early

    def specs(self) -> list[PurgeSpec]:
        assert self.previous_version is not None
        if self.tenants is None:
            return [PurgeSpec(self.model_id, self.previous_version)]
        return [PurgeSpec(self.model_id, self.previous_version, t) for t in self.tenants]

    def to_bytes(self) -> bytes:
        return orjson.dumps(asdict(self))

    @classmethod
    def from_event(cls, ev: ModelDeployed, default_grace_s: int) -> DeployJob:
        return cls(
            deploy_id=ev.deploy_id,
            model_id=ev.model_id,
            version=ev.version,
            previous_version=ev.previous_version,
            tenants=list(ev.tenants) if ev.tenants is not None else None,
            grace_s=default_grace_s if ev.grace_s is None else ev.grace_s,
        )


@dataclass(frozen=True)
class Supersede:
    """A newer deploy's verdict on an older unfinished job of the same model."""

    by: str
    action: Literal["end_grace", "cancel"]


def supersede_action(older: DeployJob, newer: DeployJob) -> Supersede | None:
    """What `newer` does to `older` (see the module docstring); None if unrelated."""
    if older.model_id != newer.model_id or older.deploy_id == newer.deploy_id:
        return None
    if older.phase in TERMINAL:
        return None
    if older.previous_version is not None and older.previous_version == newer.version:
        return Supersede(newer.deploy_id, "cancel")
    return Supersede(newer.deploy_id, "end_grace")
