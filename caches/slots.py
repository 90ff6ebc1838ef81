"""Redis Cluster rules in one place: which client is a cluster, keys by slot, every primary.

A cluster refuses a multi-key command whose keys lie in more than one slot (CROSSSLOT), runs a
script only on keys of one slot, and answers SCAN and CLIENT TRACKING for its own keys alone.
Every key of a tenant shares the tag {t:<tenant>} (one slot), so the hot path never meets these
rules; the few cross-tenant operations (retirement, batched invalidation, purges, the L1's
tracking) group by slot or run per primary through the helpers here. On one server they are
the plain commands, with no slot arithmetic.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from typing import Any, TypeVar

import redis
from redis.cluster import RedisCluster
from redis.crc import key_slot

_K = TypeVar("_K", str, bytes)


def is_cluster(r: object) -> bool:
    """A RedisCluster (sync or asyncio) or one of its pipelines."""
    from redis.asyncio.cluster import ClusterPipeline as AsyncClusterPipeline
    from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster

    return isinstance(r, RedisCluster | AsyncRedisCluster | AsyncClusterPipeline)


def slot(key: str | bytes) -> int:
    return int(key_slot(key.encode() if isinstance(key, str) else key))


def by_slot(keys: Iterable[_K]) -> dict[int, list[_K]]:
    """Keys grouped by cluster slot, each group in the order given."""
    groups: dict[int, list[_K]] = defaultdict(list)
    for k in keys:
        groups[slot(k)].append(k)
    return dict(groups)


def groups(r: object, keys: Sequence[_K]) -> list[list[_K]]:
    """Keys in groups a multi-key command takes: one group on a server, one per slot on a
    cluster."""
    if not keys:
        return []
    return list(by_slot(keys).values()) if is_cluster(r) else [list(keys)]


def mget(r: redis.Redis, keys: Sequence[str]) -> list[Any]:
    """MGET in the order given: one command on a server, one per slot (pipelined) on a cluster."""
    if not keys:
        return []
    if is_cluster(r):
        return list(r.mget_nonatomic(keys))  # type: ignore[attr-defined]
    return list(r.mget(keys))


def unlink_in(pipe: Any, keys: Sequence[_K], cluster: bool) -> None:
    """Queue UNLINK of `keys` on a pipeline: one command, or one per slot on a cluster."""
    for group in by_slot(keys).values() if cluster else [keys]:
        if group:
            pipe.execute_command("UNLINK", *group)


def primaries(r: redis.Redis) -> list[tuple[str, redis.Redis]]:
    """(name, client) of every primary: the one server, or each primary of a cluster."""
    if is_cluster(r):
        c: Any = r
        return [(n.name, c.get_redis_connection(n)) for n in c.get_primaries()]
    kw = r.connection_pool.connection_kwargs
    return [(f"{kw.get('host', 'unix')}:{kw.get('port', kw.get('path'))}/{kw.get('db', 0)}", r)]


def script_in(pipe: Any, script: Any, keys: Sequence[Any], args: Sequence[Any]) -> None:
    """Queue a registered script (redis.commands.core.Script) on a pipeline.

    A server pipeline loads the script before it runs (Script does it). A cluster pipeline
    refuses EVALSHA and could not load the script on the node that lacks it (a primary
    promoted by a failover has an empty script cache), so there it goes as EVAL with its text:
    ~0.5 KB more per call, compiled once per node and cached by the server."""
    if is_cluster(pipe):  # a sync ClusterPipeline is a RedisCluster
        pipe.execute_command("EVAL", script.script, len(keys), *keys, *args)
    else:
        script(keys=keys, args=args, client=pipe)


def mget_in(pipe: Any, keys: Sequence[str]) -> None:
    """Queue MGET of keys of one slot on a pipeline (a cluster pipeline refuses .mget, which
    could span slots; the command itself is routed by its keys' slot)."""
    pipe.execute_command("MGET", *keys)


def evalsha_in(pipe: Any, sha: str, keys: Sequence[Any], args: Sequence[Any]) -> None:
    """Queue EVALSHA on a pipeline (a cluster pipeline refuses .evalsha; the caller loads the
    script on NoScriptError, as a server's pipeline does)."""
    pipe.execute_command("EVALSHA", sha, len(keys), *keys, *args)
