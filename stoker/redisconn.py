"""Redis clients from a URL: one server, or a Redis Cluster for redis+cluster:// URLs.

    redis://host:6379/0                  one server (redis.Redis)
    redis+cluster://host:7000            a cluster, seeded by one node (redis.cluster.RedisCluster);
    redis+cluster://h1:7000,h2:7001      ... or by several, tried in turn at start
    rediss+cluster://...                 the same over TLS

A cluster client is typed as redis.Redis for the packages below: it takes the same commands for
keys of one slot (every key of a tenant shares the tag {t:<tenant>}), and the few places that
must act per slot or per primary ask caches.slots.is_cluster at run time.
"""

from __future__ import annotations

from typing import Any, cast
from urllib.parse import urlsplit, urlunsplit

import redis

from schemas.errors import ConfigError

CLUSTER_SCHEMES = {"redis+cluster": "redis", "rediss+cluster": "rediss"}


def is_cluster_url(url: str) -> bool:
    return urlsplit(url).scheme in CLUSTER_SCHEMES


def _seeds(url: str) -> tuple[str, list[tuple[str, int]]]:
    """(the URL as redis-py reads it, with the first seed; every seed as (host, port))."""
    parts = urlsplit(url)
    creds, _, hosts = parts.netloc.rpartition("@")
    seeds: list[tuple[str, int]] = []
    for hp in hosts.split(","):
        host, _, port = hp.rpartition(":")
        if not host or not port.isdigit():
            raise ConfigError(f"redis cluster URL {url!r}: every seed must be host:port")
        seeds.append((host, int(port)))
    if parts.path.strip("/") not in ("", "0"):
        raise ConfigError(f"redis cluster URL {url!r}: a cluster has only database 0")
    first = f"{creds}@{hosts.split(',')[0]}" if creds else hosts.split(",")[0]
    plain = urlunsplit((CLUSTER_SCHEMES[parts.scheme], first, "", parts.query, ""))
    return plain, seeds


def connect(url: str, **kwargs: Any) -> redis.Redis:
    """A client for `url`; kwargs go to redis-py (timeouts, decode_responses)."""
    if not is_cluster_url(url):
        return redis.Redis.from_url(url, **kwargs)
    from redis.cluster import ClusterNode, RedisCluster

    plain, seeds = _seeds(url)
    nodes = [ClusterNode(h, p) for h, p in seeds[1:]]  # type: ignore[no-untyped-call]
    extra = {"startup_nodes": nodes} if nodes else {}
    return cast(redis.Redis, RedisCluster.from_url(plain, **extra, **kwargs))


def connect_async(url: str, **kwargs: Any) -> Any:
    """The redis.asyncio client for `url` (the gateway's event loop)."""
    import redis.asyncio as aredis

    if not is_cluster_url(url):
        return aredis.Redis.from_url(url, **kwargs)
    from redis.asyncio.cluster import ClusterNode, RedisCluster

    plain, seeds = _seeds(url)
    nodes = [ClusterNode(h, p) for h, p in seeds[1:]]
    extra = {"startup_nodes": nodes} if nodes else {}
    return RedisCluster.from_url(plain, **extra, **kwargs)
