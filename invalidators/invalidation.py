"""Event-based invalidation: by doc version, context hash, doc, namespace and prompt template.

Every move follows the lease protocol of caches/generations.py, in this order:
1. move the generation first (raise the doc floor, INCR the context / namespace generation,
   retire the template), so a write that began earlier is refused from this instant;
2. then read the write-time index (doc id or context hash -> entry keys) and delete what it
   names in Redis and in the semantic store, dropping the members from the index.
A write that landed before step 1 is already in the index (the write script adds it in the same
atomic step), and none that begins to land after step 1 gets through, so nothing stale survives.
Every move is idempotent: floors only rise, a second delete finds nothing, and an older event
replayed after a newer one deletes no more than the newer one did. A batch spans tenants, so on
a Redis Cluster its reads and deletes go one slot at a time (caches/slots.py).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import redis

from caches import changes, slots
from caches import keys as K
from caches.boundary import as_bytes, redis_boundary
from caches.generations import Generations
from caches.semantic.base import SemanticStore
from invalidators.purge import PurgeOptions, PurgeProgress, Purger, PurgeSpec
from schemas.entries import CacheEntry, EntryDecodeError
from schemas.errors import PoisonError
from schemas.events import Invalidate, KnowledgeBaseChanged, PromptTemplateChanged

log = logging.getLogger(__name__)

# Entries fetched per MGET: 500 entries of ~1 KB keep a reply near 0.5 MB.
FETCH_CHUNK = 500


class InvalidationUnsupported(PoisonError):
    """An invalidation stoker cannot carry out (by="entity": entries keep no entity index)."""


@dataclass(frozen=True)
class Scope:
    """Optional narrowing of an Invalidate event; None matches anything."""

    model_id: str | None = None
    model_version: str | None = None
    template_version: str | None = None

    def admits(self, key: str) -> bool:
        if self.model_id is None and self.model_version is None and self.template_version is None:
            return True
        ns = K.entry_key_namespace(key)
        if ns is None:
            return True  # not an entry key we can parse: deleting it is the safe side
        _, model, version, template = ns
        return (
            self.model_id in (None, model)
            and self.model_version in (None, version)
            and self.template_version in (None, template)
        )


@dataclass(frozen=True)
class InvalidationResult:
    """What one invalidation did: entries deleted, entries kept (newer), members already gone."""

    by: str
    deleted: int = 0
    kept: int = 0
    pruned: int = 0
    floor: int | None = None


class Invalidator:
    """Carries out invalidations against Redis and the semantic store; safe to call twice."""

    def __init__(
        self,
        r: redis.Redis,
        semantic: SemanticStore | None = None,
        purge_opts: PurgeOptions | None = None,
    ) -> None:
        self._r = r
        self._semantic = semantic
        self._cluster = slots.is_cluster(r)
        self.generations = Generations(r)
        self.purger = Purger(r, semantic)
        self._purge_opts = purge_opts or PurgeOptions()

    def note_changes(
        self, events: Sequence[KnowledgeBaseChanged | PromptTemplateChanged | Invalidate]
    ) -> None:
        """Mark each tenant's answers as changed at its latest event's time, for the monitor's
        check of exact hits served soon after (caches/changes.py)."""
        latest: dict[str, float] = {}
        for ev in events:
            latest[ev.tenant] = max(latest.get(ev.tenant, 0.0), ev.ts.timestamp())
        changes.note(self._r, latest)

    def close(self) -> None:
        """Close the clients this invalidator was handed (the worker owns them through it)."""
        if self._semantic is not None:
            self._semantic.close()
        self._r.close()

    # -- events --

    def kb_changed(self, ev: KnowledgeBaseChanged) -> InvalidationResult:
        """Entries built on any version of the doc older than the event's are stale.

        "updated" to version v: versions < v are stale. "retracted" / "deleted" at v: v itself
        is gone too, so the floor is v + 1 and no entry built on the doc survives.
        """
        want = ev.doc_version if ev.change == "updated" else ev.doc_version + 1
        floor = self.generations.raise_doc_floor(ev.tenant, ev.doc_id, want)
        # The floor may already be higher (a newer event came first): use it, never lower.
        return self.below_floor(ev.tenant, ev.doc_id, floor)

    def kb_changed_many(self, events: Sequence[KnowledgeBaseChanged]) -> InvalidationResult:
        """kb_changed for a batch in a fixed number of round trips (4 + one semantic delete).

        Same protocol, batched: 1. every floor is raised (one pipeline), 2. then every doc
        index is read (one pipeline), 3. the members fetched (MGET), 4. the stale deleted and
        the indexes pruned (one pipeline). Several events for one doc collapse to the highest
        floor, which is what applying them one by one leaves behind (floors only rise).
        """
        wanted: dict[tuple[str, str], int] = {}
        for ev in events:
            want = ev.doc_version if ev.change == "updated" else ev.doc_version + 1
            wanted[(ev.tenant, ev.doc_id)] = max(want, wanted.get((ev.tenant, ev.doc_id), 0))
        docs = list(wanted)
        floors = self.generations.raise_doc_floors([(t, d, f) for (t, d), f in wanted.items()])
        indexes = [K.doc_index_key(t, d) for t, d in docs]
        with redis_boundary("read indexes"):
            pipe = self._r.pipeline(transaction=False)
            for index in indexes:
                pipe.smembers(index)
            member_sets = pipe.execute()
        owners: list[tuple[int, str]] = [
            (i, as_bytes(m).decode()) for i, ms in enumerate(member_sets) for m in ms
        ]
        fetched = dict(self._fetch([k for _, k in owners]))
        stale: dict[int, list[str]] = {}
        gone: dict[int, list[str]] = {}
        kept = 0
        for i, key in owners:
            blob = fetched[key]
            if blob is None:
                gone.setdefault(i, []).append(key)
            elif _doc_version(blob, docs[i][1]) < floors[i]:
                stale.setdefault(i, []).append(key)
            else:
                kept += 1
        self._delete_many(indexes, stale, gone)
        n_stale = sum(map(len, stale.values()))
        return InvalidationResult("kb", n_stale, kept, sum(map(len, gone.values())))

    def _delete_many(
        self, indexes: list[str], stale: dict[int, list[str]], gone: dict[int, list[str]]
    ) -> None:
        doomed = sorted({k for ks in stale.values() for k in ks})
        dropped = {i: [*stale.get(i, []), *gone.get(i, [])] for i in {*stale, *gone}}
        if dropped:
            with redis_boundary("delete entries"):
                pipe = self._r.pipeline(transaction=False)
                slots.unlink_in(pipe, doomed, self._cluster)  # tenants' slots differ
                for i, keys in dropped.items():
                    pipe.srem(indexes[i], *keys)
                pipe.execute()
        points = sorted({k for ks in dropped.values() for k in ks})
        if self._semantic is not None and points:
            self._semantic.delete_entries(points)

    def template_changed(self, ev: PromptTemplateChanged) -> PurgeProgress:
        self.generations.retire_template(ev.tenant, ev.model_id, ev.old_template_version)
        spec = PurgeSpec(ev.model_id, None, ev.tenant, ev.old_template_version)
        return self.purger.run(spec, self._purge_opts)

    def invalidate(self, ev: Invalidate) -> InvalidationResult:
        scope = Scope(ev.model_id, ev.model_version, ev.template_version)
        if ev.by == "context_hash":
            return self.context(ev.tenant, ev.value, scope)
        if ev.by == "doc":
            return self.doc(ev.tenant, ev.value, scope)
        if ev.by == "namespace":
            assert ev.model_id is not None  # the event's validator guarantees it
            prog = self.namespace(ev.tenant, ev.model_id, ev.model_version, ev.template_version)
            return InvalidationResult("namespace", deleted=prog.deleted)
        raise InvalidationUnsupported(
            f'invalidate by="{ev.by}" is not supported: cache entries keep no {ev.by} index; '
            "invalidate by doc or context_hash instead"
        )

    # -- moves --

    def below_floor(self, tenant: str, doc_id: str, floor: int) -> InvalidationResult:
        """Delete the doc's indexed entries built on a version under `floor` (already raised)."""
        index = K.doc_index_key(tenant, doc_id)
        members = self._members(index)
        stale: list[str] = []
        gone: list[str] = []
        kept = 0
        for key, blob in self._fetch(members):
            if blob is None:
                gone.append(key)
            elif _doc_version(blob, doc_id) < floor:
                stale.append(key)
            else:
                kept += 1
        self._delete(index, stale, gone)
        return InvalidationResult("kb", len(stale), kept, len(gone), floor)

    def context(self, tenant: str, ctx_hash: str, scope: Scope = Scope()) -> InvalidationResult:
        self.generations.bump_context(tenant, ctx_hash)
        index = K.context_index_key(tenant, ctx_hash)
        members = [k for k in self._members(index) if scope.admits(k)]
        return self._delete_existing("context_hash", index, members)

    def doc(self, tenant: str, doc_id: str, scope: Scope = Scope()) -> InvalidationResult:
        """Delete every indexed entry built on the doc, whatever its version.

        No version names the stale ones here, so the floor cannot move; instead the context
        generation of every entry found is bumped first, which refuses in-flight writes of those
        contexts. A write of a context never cached before may still land: it was computed
        from the doc as it is now, and its TTL bounds it.
        """
        index = K.doc_index_key(tenant, doc_id)
        members = [k for k in self._members(index) if scope.admits(k)]
        found = list(self._fetch(members))
        contexts = {_context_of(blob) for _, blob in found if blob is not None}
        for ctx in sorted(c for c in contexts if c):
            self.generations.bump_context(tenant, ctx)
        return self._delete_existing("doc", index, members)

    def namespace(
        self,
        tenant: str,
        model_id: str,
        model_version: str | None,
        template_version: str | None,
    ) -> PurgeProgress:
        """Bump what the event names, then purge the tenant's namespace.

        A bump (not a retirement): in-flight writes are refused, later ones land, so a flush
        does not disable caching for good. With neither version nor template named, no
        generation covers "every version", so in-flight writes of that model may land after the
        purge; their TTL bounds them.
        """
        if model_version is not None:
            self.generations.bump_model_version(tenant, model_id, model_version)
        if template_version is not None:
            self.generations.bump_template(tenant, model_id, template_version)
        spec = PurgeSpec(model_id, model_version, tenant, template_version)
        return self.purger.run(spec, self._purge_opts)

    # -- helpers --

    def _members(self, index: str) -> list[str]:
        with redis_boundary("read index"):
            raw = self._r.smembers(index)
        return sorted(as_bytes(m).decode() for m in raw)

    def _fetch(self, keys: Sequence[str]) -> Iterable[tuple[str, bytes | None]]:
        for i in range(0, len(keys), FETCH_CHUNK):
            chunk = keys[i : i + FETCH_CHUNK]
            with redis_boundary("fetch entries"):
                blobs = slots.mget(self._r, chunk)  # a batch spans tenants: MGET per slot
            for key, blob in zip(chunk, blobs, strict=True):
                yield key, None if blob is None else as_bytes(blob)

    def _delete_existing(self, by: str, index: str, members: list[str]) -> InvalidationResult:
        with redis_boundary("delete entries"):
            pipe = self._r.pipeline(transaction=False)
            for key in members:
                pipe.unlink(key)
            existed = pipe.execute() if members else []
        deleted = sum(1 for n in existed if n)
        self._delete(index, [], members)
        return InvalidationResult(by, deleted, 0, len(members) - deleted)

    def _delete(self, index: str, stale: list[str], gone: list[str]) -> None:
        """UNLINK the stale entries, drop them and the vanished ones from the index, then their
        points (a vanished entry's point is an orphan a late upsert may have left: drop it too)."""
        if stale or gone:
            with redis_boundary("delete entries"):
                pipe = self._r.pipeline(transaction=False)
                slots.unlink_in(pipe, stale, cluster=False)  # one tenant: the index's slot
                pipe.srem(index, *stale, *gone)
                pipe.execute()
        if self._semantic is not None and (stale or gone):
            # After Redis: a point whose entry is gone is never served (client.py skips it).
            self._semantic.delete_entries([*stale, *gone])


def _doc_version(blob: bytes, doc_id: str) -> int:
    """The doc's version the entry was built on; -1 (stale under any floor) if unreadable, or
    if the retriever named the doc without a version: any change of the doc may have changed
    what the answer was built on, so such an entry never survives one."""
    try:
        entry = CacheEntry.from_bytes(blob)
    except EntryDecodeError:
        log.warning("unreadable entry under a doc index; deleting it")
        return -1
    v = next((v for d, v in entry.docs if d == doc_id), -1)
    return -1 if v is None else v


def _context_of(blob: bytes) -> str:
    try:
        return CacheEntry.from_bytes(blob).context_hash
    except EntryDecodeError:
        return ""
