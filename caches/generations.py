"""Generation-checked writes (leases): a write begun before an invalidation never lands after it.

Protocol, one round trip each side:
1. On a miss, ``snapshot`` reads the generations of everything the answer depends on (model
   version, template version, context hash, and the generation of each doc named by id
   alone) into a WriteTicket, before the GPU computes.
2. An invalidation first moves the generation (INCR a context, raise a doc's version floor and
   INCR its doc generation, mark a version "retired"), then deletes the entries it found
   through the indexes.
3. ``WRITE_SCRIPT`` lands the entry only if every generation still equals the snapshot, no
   namespace is retired and every versioned doc is at or above its floor; in the same
   atomic step it adds the key to the doc / context indexes, whose TTL follows the entry's.
All keys of one call share the tenant hash tag, so this holds on Redis Cluster too; the moves
that span tenants (retire, reinstate, batched floors) go one slot at a time (caches/slots.py).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import redis

from caches import constants as C
from caches import keys as K
from caches import slots
from caches.boundary import as_bytes, redis_boundary
from schemas.common import DocRef, utcnow

# KEYS = [entry, check_1..check_n, index_1..index_m]
# ARGV = [n, mode_1, value_1, ..., mode_n, value_n, payload, ttl_ms]
# mode "eq": the key's value (absent = "0") must equal value and not be "retired";
# mode "floor": the key's number (absent = 0) must be <= value (a doc version).
WRITE_LUA = """
local n = tonumber(ARGV[1])
for i = 1, n do
  local mode = ARGV[2 * i]
  local want = ARGV[2 * i + 1]
  local cur = redis.call('GET', KEYS[i + 1])
  if mode == 'eq' then
    if cur == false then cur = '0' end
    if cur == 'retired' or cur ~= want then return {0, KEYS[i + 1]} end
  else
    if cur ~= false and tonumber(cur) > tonumber(want) then return {0, KEYS[i + 1]} end
  end
end
local payload = ARGV[2 * n + 2]
local ttl = tonumber(ARGV[2 * n + 3])
redis.call('SET', KEYS[1], payload, 'PX', ttl)
for j = n + 2, #KEYS do
  redis.call('SADD', KEYS[j], KEYS[1])
  if redis.call('PTTL', KEYS[j]) < ttl then redis.call('PEXPIRE', KEYS[j], ttl) end
end
return {1, ''}
"""

# Raise a doc's version floor (KEYS[1]), never lower it: out-of-order events do no harm. Move
# its doc generation (KEYS[2]) whatever the version: answers built on the doc named by id alone
# cannot be compared with a floor, so every change refuses their in-flight writes.
RAISE_FLOOR_LUA = """
redis.call('INCR', KEYS[2])
redis.call('EXPIRE', KEYS[2], ARGV[2])
local cur = tonumber(redis.call('GET', KEYS[1]) or '0')
local want = tonumber(ARGV[1])
if want > cur then redis.call('SET', KEYS[1], ARGV[1], 'EX', ARGV[2]) return want end
redis.call('EXPIRE', KEYS[1], ARGV[2])
return cur
"""

# Move a namespace generation (model version or template) unless it is retired: INCR would fail
# on "retired", and a retired namespace must stay retired. Returns -1 for a retired one.
BUMP_LUA = """
local cur = redis.call('GET', KEYS[1])
if cur == 'retired' then return -1 end
local gen = redis.call('INCR', KEYS[1])
redis.call('EXPIRE', KEYS[1], ARGV[1])
return gen
"""

# Reinstate retired namespaces (a rollback to a retired version): each KEYS[i] that says
# "retired" gets ARGV[1], a generation no snapshot can hold (INCR counters never get near it),
# so a write that read the generation before or during the retirement is still refused.
# Returns how many were reinstated.
REINSTATE_LUA = """
local n = 0
for i = 1, #KEYS do
  if redis.call('GET', KEYS[i]) == 'retired' then
    redis.call('SET', KEYS[i], ARGV[1], 'EX', ARGV[2])
    n = n + 1
  end
end
return n
"""


@dataclass(frozen=True)
class WriteTicket:
    """What a miss hands the caller: the key to write and the generations seen before computing."""

    key: K.CacheKey
    docs: tuple[DocRef, ...]
    gens: tuple[tuple[str, bytes], ...]
    began_at: datetime = field(default_factory=utcnow)
    retired: bool = False

    def checks(self) -> list[tuple[str, str, str]]:
        """(key, mode, value): generations (and versionless docs' generations) must be equal,
        versioned docs at or above their floor."""
        out = [(k, "eq", v.decode()) for k, v in self.gens]
        t = self.key.ns.tenant
        out += [
            (K.doc_floor_key(t, d.doc_id), "floor", str(d.version))
            for d in self.docs
            if d.version is not None
        ]
        return out

    def doc_generations(self) -> dict[str, int]:
        """doc id -> generation seen, for each doc named by id alone (see gen_keys)."""
        t = self.key.ns.tenant
        seen = dict(self.gens)
        return {
            d.doc_id: int(seen.get(K.doc_gen_key(t, d.doc_id), b"0"))
            for d in self.docs
            if d.version is None
        }

    def index_keys(self) -> list[str]:
        t = self.key.ns.tenant
        idx = [K.doc_index_key(t, d.doc_id) for d in self.docs]
        return [*idx, K.context_index_key(t, self.key.context_hash)]


def gen_keys(key: K.CacheKey, docs: Sequence[DocRef] = ()) -> list[str]:
    """What a write depends on by generation: the namespace, the context, and each doc the
    retriever named without a version."""
    t = key.ns.tenant
    versionless = sorted({d.doc_id for d in docs if d.version is None})
    return [
        K.model_gen_key(key.ns),
        K.template_gen_key(key.ns),
        K.context_gen_key(t, key.context_hash),
        *(K.doc_gen_key(t, d) for d in versionless),
    ]


def ticket_of(
    key: K.CacheKey,
    docs: Sequence[DocRef],
    names: Sequence[str],
    globally_retired: bool,
    vals: Sequence[bytes | None],
) -> WriteTicket:
    """The ticket a snapshot read: `vals` are the values of `names` (gen_keys), in order."""
    gens = tuple((n, v if v is not None else b"0") for n, v in zip(names, vals, strict=True))
    retired = globally_retired or any(v == C.RETIRED for _, v in gens)
    return WriteTicket(key=key, docs=tuple(docs), gens=gens, retired=retired)


def write_call(ticket: WriteTicket, payload: bytes, ttl_s: int) -> tuple[list[str], list[Any]]:
    """(KEYS, ARGV) of WRITE_LUA for the ticket's entry (see the script's header)."""
    checks = ticket.checks()
    argv: list[Any] = [len(checks)]
    for _, mode, value in checks:
        argv += [mode, value]
    argv += [payload, ttl_s * 1000]
    keys = [ticket.key.exact(), *(k for k, _, _ in checks), *ticket.index_keys()]
    return keys, argv


def write_outcome(reply: Any) -> str | None:
    """WRITE_LUA's reply: None when the entry landed, else the key that refused it."""
    ok, refused_by = reply
    return None if int(ok) == 1 else as_bytes(refused_by).decode()


class Generations:
    """Snapshot, check-and-write, and the moves invalidators make."""

    def __init__(self, r: redis.Redis) -> None:
        self._r = r
        self._write = r.register_script(WRITE_LUA)
        self._raise_floor = r.register_script(RAISE_FLOOR_LUA)
        self._bump = r.register_script(BUMP_LUA)
        self._reinstate = r.register_script(REINSTATE_LUA)
        self._known_tenants: set[str] = set()

    def snapshot(self, key: K.CacheKey, docs: Sequence[DocRef]) -> WriteTicket:
        """Read the generations before computing. Registers the tenant first (see retirement)."""
        self._register_tenant(key.ns.tenant)
        names = gen_keys(key, docs)
        with redis_boundary("snapshot"):
            pipe = self._r.pipeline(transaction=False)
            pipe.exists(K.retired_marker_key(key.ns.model_id, key.ns.model_version))
            slots.mget_in(pipe, names)  # one tenant: one slot
            globally_retired, vals = pipe.execute()
        return ticket_of(key, docs, names, bool(globally_retired), vals)

    def write(self, ticket: WriteTicket, payload: bytes, ttl_s: int) -> str | None:
        """Land the entry atomically; returns None when it landed, else the key that refused it."""
        if ticket.retired:
            return K.model_gen_key(ticket.key.ns)
        keys, argv = write_call(ticket, payload, ttl_s)
        with redis_boundary("write"):
            reply = self._write(keys=keys, args=argv)
        return write_outcome(reply)

    def registered(self, tenant: str) -> bool:
        """Whether this process registered the tenant already (an async caller registers
        it itself, then calls note_registered)."""
        return tenant in self._known_tenants

    def note_registered(self, tenant: str) -> None:
        self._known_tenants.add(tenant)

    def _register_tenant(self, tenant: str) -> None:
        # Retirement (1) sets the global marker, (2) reads this set, (3) marks every tenant in
        # it. A writer registers, then snapshots marker + generations. If it registered before
        # (2), its tenant is marked in (3): before the snapshot (seen) or after (generation
        # moved, write refused). If after (2), its snapshot follows (1) and sees the marker.
        if tenant not in self._known_tenants:
            with redis_boundary("register tenant"):
                self._r.sadd(C.TENANT_REGISTRY, tenant)
            self._known_tenants.add(tenant)

    # -- the moves invalidators make (bump first, then delete) --

    def bump_context(self, tenant: str, ctx_hash: str) -> int:
        key = K.context_gen_key(tenant, ctx_hash)
        with redis_boundary("bump context"):
            pipe = self._r.pipeline(transaction=True)
            pipe.incr(key)
            pipe.expire(key, C.GENERATION_TTL_S)
            gen, _ = pipe.execute()
        return int(gen)

    def raise_doc_floor(self, tenant: str, doc_id: str, floor: int) -> int:
        with redis_boundary("raise doc floor"):
            return int(
                self._raise_floor(
                    keys=[K.doc_floor_key(tenant, doc_id), K.doc_gen_key(tenant, doc_id)],
                    args=[floor, C.GENERATION_TTL_S],
                )
            )

    def retire_model_version(self, model_id: str, model_version: str) -> list[str]:
        """Mark the version retired in every tenant that ever wrote; returns those tenants."""
        with redis_boundary("retire model version"):
            self._r.set(K.retired_marker_key(model_id, model_version), 1)
            tenants = sorted(as_bytes(t).decode() for t in self._r.smembers(C.TENANT_REGISTRY))
            pipe = self._r.pipeline(transaction=False)
            for t in tenants:
                ns = K.Namespace(t, model_id, model_version, "")
                pipe.set(K.model_gen_key(ns), C.RETIRED)
            pipe.execute()
        return tenants

    def reinstate_model_version(
        self, model_id: str, model_version: str, tenants: Sequence[str] | None = None
    ) -> int:
        """Undo retire_model_version (all tenants) or retire_tenant_version (`tenants`): writes
        land again from now on. A tenant list also lifts the global marker; the other tenants
        that ever wrote stay retired through their own generations (retire_model_version set
        them). A no-op for a version that is not retired. Returns how many tenant namespaces
        were reinstated."""
        with redis_boundary("reinstate model version"):
            if tenants is None:
                tenants = sorted(as_bytes(t).decode() for t in self._r.smembers(C.TENANT_REGISTRY))
            keys = [K.model_gen_key(K.Namespace(t, model_id, model_version, "")) for t in tenants]
            fresh = int(time.time() * 1000)
            # One script per slot on a cluster (each tenant's keys live in its own).
            n = sum(
                int(self._reinstate(keys=group, args=[fresh, C.GENERATION_TTL_S]))
                for group in slots.groups(self._r, keys)
            )
            self._r.delete(K.retired_marker_key(model_id, model_version))
        return n

    def retire_template(self, tenant: str, model_id: str, template_version: str) -> None:
        ns = K.Namespace(tenant, model_id, "", template_version)
        with redis_boundary("retire template"):
            self._r.set(K.template_gen_key(ns), C.RETIRED)

    def bump_model_version(self, tenant: str, model_id: str, model_version: str) -> int:
        """Refuse every in-flight write of this tenant's version; later writes land. -1 = retired."""
        key = K.model_gen_key(K.Namespace(tenant, model_id, model_version, ""))
        with redis_boundary("bump model version"):
            return int(self._bump(keys=[key], args=[C.GENERATION_TTL_S]))

    def bump_template(self, tenant: str, model_id: str, template_version: str) -> int:
        """Refuse every in-flight write of this tenant's template; later writes land. -1 = retired."""
        key = K.template_gen_key(K.Namespace(tenant, model_id, "", template_version))
        with redis_boundary("bump template"):
            return int(self._bump(keys=[key], args=[C.GENERATION_TTL_S]))

    def retire_tenant_version(self, tenant: str, model_id: str, model_version: str) -> None:
        """Retire one tenant's namespace of a version (retire_model_version does every tenant)."""
        key = K.model_gen_key(K.Namespace(tenant, model_id, model_version, ""))
        with redis_boundary("retire tenant version"):
            self._r.set(key, C.RETIRED)

    def raise_doc_floors(self, floors: Sequence[tuple[str, str, int]]) -> list[int]:
        """raise_doc_floor for many (tenant, doc_id, floor) in one round trip; the floors now."""
        if not floors:
            return []
        with redis_boundary("raise doc floors"):
            pipe = self._r.pipeline(transaction=False)
            for tenant, doc_id, floor in floors:
                keys = [K.doc_floor_key(tenant, doc_id), K.doc_gen_key(tenant, doc_id)]
                slots.script_in(pipe, self._raise_floor, keys, [floor, C.GENERATION_TTL_S])
            return [int(v) for v in pipe.execute()]
