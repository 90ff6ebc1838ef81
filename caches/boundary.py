"""Translate redis, qdrant and httpx errors into stoker's error tree, in one place."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import httpx
import redis.exceptions as rex

from schemas.errors import BackendUnavailable, CacheUnavailable, StokerError

# What a Redis failure looks like from redis-py: RedisError, and on a cluster also
# RedisClusterException, which is no RedisError (raised when no node answers for the slots,
# as in the seconds of a failover).
REDIS_ERRORS: tuple[type[Exception], ...] = (rex.RedisError, rex.RedisClusterException)


@contextmanager
def redis_boundary(op: str) -> Iterator[None]:
    """Every Redis failure is retriable for the caller: the entry's TTL is the guarantee."""
    try:
        yield
    except REDIS_ERRORS as e:
        raise CacheUnavailable(f"redis {op} failed: {type(e).__name__}: {e}") from e


@contextmanager
def qdrant_boundary(op: str) -> Iterator[None]:
    """Qdrant client and Edge raise assorted exceptions; all are a semantic store that failed."""
    try:
        yield
    except StokerError:
        raise
    except Exception as e:  # qdrant-client raises httpx/grpc/ValueError; Edge raises RuntimeError
        raise CacheUnavailable(f"qdrant {op} failed: {type(e).__name__}: {e}") from e


@contextmanager
def http_boundary(op: str) -> Iterator[None]:
    try:
        yield
    except httpx.HTTPStatusError as e:
        raise BackendUnavailable(f"{op}: HTTP {e.response.status_code}") from e
    except httpx.HTTPError as e:
        raise BackendUnavailable(f"{op}: {type(e).__name__}: {e}") from e


def as_bytes(v: bytes | str) -> bytes:
    """redis-py is typed `bytes | str`; our clients never decode responses, so this is bytes."""
    return v if isinstance(v, bytes) else v.encode()
