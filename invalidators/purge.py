"""Staggered purge of a model version's entries: SCAN every primary, UNLINK in paced batches.

Per Redis primary, until its cursor comes back to 0:
1. SCAN MATCH (caches.keys.entries_pattern) until a batch of keys is collected;
2. one pipeline: UNLINK the batch (grouped by slot on a cluster) and save the checkpoint with
   the cursor *after* the batch, so a restart resumes there and never starts over;
3. wait for the token bucket (keys/s, paid after the batch) and the pause between batches;
then the Qdrant side in one filter delete. Doc / context index sets are left to their TTL:
they mix entries of every version, so no pattern can purge them, and an invalidation that
meets a vanished member drops it (invalidation.py).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import redis
from pydantic import BaseModel, ConfigDict, Field

from backends.pacing import TokenBucket
from caches import keys as K
from caches import slots
from caches.boundary import as_bytes, redis_boundary
from caches.semantic.base import SemanticStore
from invalidators import metrics as M
from invalidators.checkpoint import Checkpoints

# SCAN COUNT per call: 1,000 keeps each call under ~1 ms of server time on a 1M-key node
# (SCAN is O(COUNT)) while amortising the round trip (bench_purge; docs/benchmarks.md,
# "Invalidation").
DEFAULT_BATCH = 1_000


@dataclass(frozen=True)
class PurgeSpec:
    """What goes: a model's entries, narrowed by version, tenant and template (None = all)."""

    model_id: str
    model_version: str | None
    tenant: str | None = None
    template_version: str | None = None

    def __post_init__(self) -> None:
        if self.model_version is None and self.template_version is None and self.tenant is None:
            raise ValueError("a purge needs a version, a template or a tenant besides the model")

    @property
    def pattern(self) -> str:
        return K.entries_pattern(
            self.model_id,
            self.model_version,
            tenant=self.tenant,
            template_version=self.template_version,
        )

    @property
    def job_id(self) -> str:
        """Deterministic, so running the same purge again resumes its checkpoint."""
        parts = (self.model_id, self.model_version, self.template_version, self.tenant)
        return "purge:" + ":".join("*" if p is None else K.enc(p) for p in parts)

    def semantic_filter(self) -> dict[str, str]:
        must = {"model_id": self.model_id}
        for name in ("model_version", "tenant", "template_version"):
            value = getattr(self, name)
            if value is not None:
                must[name] = value
        return must


class PurgeOptions(BaseModel):
    """The owner of the deploy_purge_* settings' defaults and bounds (stoker/options.py)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    rate: float | None = Field(default=None, gt=0)  # keys/s; None = as fast as Redis takes it
    batch: int = Field(default=DEFAULT_BATCH, ge=1)
    delay_s: float = Field(default=0.0, ge=0)  # extra pause after each batch, on top of the rate
    dry_run: bool = False


@dataclass
class PurgeProgress:
    """Counts so far; `fraction` is an estimate from the SCAN cursors (see _cursor_fraction)."""

    job_id: str
    matched: int = 0
    deleted: int = 0
    batches: int = 0
    scan_calls: int = 0
    nodes_total: int = 0
    nodes_done: int = 0
    fraction: float = 0.0
    semantic_deleted: bool = False
    resumed_from: dict[str, int] = field(default_factory=dict)
    state: str = "running"  # running | done | interrupted | dry-run
    elapsed_s: float = 0.0

    @property
    def keys_per_s(self) -> float:
        return self.deleted / self.elapsed_s if self.elapsed_s > 0 else 0.0


ProgressFn = Callable[[PurgeProgress], None]


def _cursor_fraction(cursor: int, size: int) -> float:
    """SCAN walks buckets in reverse-binary order, so bit-reversing the cursor over the table's
    width gives the share of buckets already visited (exact while the table does not resize)."""
    if cursor == 0 or size <= 0:
        return 0.0
    bits = max(1, (size - 1).bit_length())
    mask = (1 << bits) - 1
    rev = int(f"{cursor & mask:0{bits}b}"[::-1], 2)
    return min(1.0, rev / (1 << bits))


@dataclass
class _Run:
    """Everything one run of a purge carries between its steps."""

    spec: PurgeSpec
    opts: PurgeOptions
    state: dict[str, Any]
    prog: PurgeProgress
    bucket: TokenBucket | None  # None: unthrottled (no rate)
    stop: threading.Event
    on_progress: ProgressFn | None
    t0: float = field(default_factory=time.monotonic)

    def report(self, state: str = "running") -> PurgeProgress:
        self.prog.state = state
        self.prog.elapsed_s = time.monotonic() - self.t0
        M.purge_reported(self.prog)
        if self.on_progress:
            self.on_progress(self.prog)
        return self.prog


class Purger:
    """Runs one PurgeSpec to completion, resumably. One runner per job id at a time."""

    def __init__(self, r: redis.Redis, semantic: SemanticStore | None = None) -> None:
        self.redis = r
        self._semantic = semantic
        self._cluster = slots.is_cluster(r)
        self.checkpoints = Checkpoints(r)

    def run(
        self,
        spec: PurgeSpec,
        opts: PurgeOptions | None = None,
        *,
        on_progress: ProgressFn | None = None,
        stop: threading.Event | None = None,
    ) -> PurgeProgress:
        """Purge until done or `stop` is set; returns the final counts (state says which)."""
        opts = opts or PurgeOptions()
        nodes = slots.primaries(self.redis)
        state = self._load_state(spec, nodes, opts.dry_run)
        prog = PurgeProgress(spec.job_id, nodes_total=len(nodes))
        prog.matched, prog.deleted = state["matched"], state["deleted"]
        prog.resumed_from = {n: s["cursor"] for n, s in state["nodes"].items() if s["cursor"]}
        # starts empty and saves a batch of credit: SCAN time overlaps the wait
        bucket = TokenBucket(opts.rate, burst=opts.batch, start=0.0) if opts.rate else None
        run = _Run(spec, opts, state, prog, bucket, stop or threading.Event(), on_progress)
        for name, client in nodes:
            if not self._run_node(run, name, client):
                return run.report("interrupted")
            prog.nodes_done += 1
        return self._complete(run)

    def _run_node(self, run: _Run, name: str, client: redis.Redis) -> bool:
        node = run.state["nodes"][name]
        with redis_boundary("dbsize"):
            size = int(client.dbsize())
        while not node["done"]:
            if run.stop.is_set() or not self._batch(run, name, client):
                return False
            share = _cursor_fraction(node["cursor"], size) if not node["done"] else 1.0
            run.prog.fraction = (run.prog.nodes_done + share) / run.prog.nodes_total
            run.report()
            if run.opts.delay_s and not node["done"] and run.stop.wait(run.opts.delay_s):
                return False
        return True

    def _load_state(
        self, spec: PurgeSpec, nodes: list[tuple[str, redis.Redis]], dry_run: bool
    ) -> dict[str, Any]:
        saved = None if dry_run else self.checkpoints.load(spec.job_id)
        fresh = {"spec": asdict(spec), "matched": 0, "deleted": 0, "nodes": {}}
        state: dict[str, Any] = saved or fresh
        for name, _ in nodes:
            # A node new since the checkpoint (cluster grew) starts at cursor 0; that is safe.
            state["nodes"].setdefault(name, {"cursor": 0, "done": False})
        return state

    def _batch(self, run: _Run, name: str, client: redis.Redis) -> bool:
        """Collect, delete and checkpoint one batch, then pace; False if stopped while pacing."""
        state, prog = run.state, run.prog
        node = state["nodes"][name]
        keys, cursor = self._collect(client, node["cursor"], run.spec.pattern, run.opts.batch, prog)
        node["cursor"], node["done"] = cursor, cursor == 0
        state["matched"] += len(keys)
        prog.matched, prog.batches = state["matched"], prog.batches + 1
        if run.opts.dry_run:
            return True
        state["deleted"] += len(keys)
        prog.deleted = state["deleted"]
        with redis_boundary("purge batch"):
            pipe = client.pipeline(transaction=False)
            # A node's client is a plain connection to that primary: its keys span the
            # node's slots, and the node refuses a multi-key command across them.
            slots.unlink_in(pipe, keys, self._cluster)
            if not self._cluster:  # same server: the checkpoint rides in the same round trip
                self.checkpoints.save_in(pipe, run.spec.job_id, state)
            pipe.execute()
        M.PURGE_DELETED.inc(len(keys))
        if self._cluster:
            self.checkpoints.save(run.spec.job_id, state)
        # Paced after the delete: the batch is done and checkpointed, so a stop while waiting
        # loses nothing, and the run's length is exactly deleted / rate.
        if run.bucket is None:
            return not run.stop.is_set()
        return run.bucket.spend(len(keys), run.stop)

    def _collect(
        self, client: redis.Redis, cursor: int, pattern: str, batch: int, prog: PurgeProgress
    ) -> tuple[list[bytes], int]:
        keys: list[bytes] = []
        with redis_boundary("scan"):
            while True:
                cursor, found = client.scan(cursor, match=pattern, count=batch)
                prog.scan_calls += 1
                keys.extend(as_bytes(k) for k in found)
                if cursor == 0 or len(keys) >= batch:
                    return keys, int(cursor)

    def _complete(self, run: _Run) -> PurgeProgress:
        if run.opts.dry_run:
            return run.report("dry-run")
        if self._semantic is not None:
            self._semantic.delete_where(run.spec.semantic_filter())
            run.prog.semantic_deleted = True
        # Cleared, not kept as "done": purging the same namespace again later must rescan.
        self.checkpoints.clear(run.spec.job_id)
        run.prog.fraction = 1.0
        return run.report("done")

    def semantic_count(self, spec: PurgeSpec) -> int | None:
        """Points the Qdrant side would delete (for a dry run); None without a semantic store."""
        return None if self._semantic is None else self._semantic.count(spec.semantic_filter())
