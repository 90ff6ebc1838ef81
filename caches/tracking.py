"""The L1's tracking connections: one per Redis primary, following the cluster's topology.

A server reports changes only of the keys it holds, so a Redis Cluster needs one tracking
connection per primary. `Listener` is one such connection on its own thread (CLIENT TRACKING
ON BCAST, RESP3 pushes); `primaries_now` says which primaries serve the slots now, asked of
any node the L1 knows (CLUSTER SLOTS), so a failover or a resharding is followed without the
cache client's help.
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Callable, Sequence
from typing import Any

import redis
from redis.connection import Connection

from caches import slots

log = logging.getLogger(__name__)

# How long a listener blocks for a message before checking stop() and sync requests: stop()
# takes at most this, and a sync() one round trip more.
_READ_S = 0.05
# Reconnect back-off after a listener's connection dropped (the L1 is off meanwhile).
_RECONNECT_S = 0.5
# Connection settings of the cache client's pool that a bare tracking connection must not
# inherit: the cluster client's own connect hook (READONLY for replica reads) and its
# maintenance-notification handlers are bound to that client.
_DROPPED_KWARGS = ("redis_connect_func", "oss_cluster_maint_notifications_handler")

PushFn = Callable[[list[Any]], None]
StateFn = Callable[["Listener", bool], None]


class Sync:
    """One sync() round trip: the PING payload, and whether its answer came back."""

    __slots__ = ("done", "ok", "payload")

    def __init__(self) -> None:
        self.payload = f"l1-sync-{uuid.uuid4().hex}"
        self.ok = False
        self.done = threading.Event()

    def finish(self, *, ok: bool) -> None:
        self.ok = ok
        self.done.set()


class Listener:
    """One tracking connection to one node. on_state(self, True) once the server said OK to
    CLIENT TRACKING, on_state(self, False) whenever it is lost (messages may have been lost)."""

    def __init__(
        self,
        name: str,
        conn_kwargs: dict[str, Any],
        prefixes: Sequence[str],
        on_push: PushFn,
        on_state: StateFn,
    ) -> None:
        self.name = name
        self._kwargs = {k: v for k, v in conn_kwargs.items() if k not in _DROPPED_KWARGS}
        self._kwargs["protocol"] = 3  # invalidations arrive as RESP3 pushes
        self._prefixes = list(prefixes)
        self._on_push, self._on_state = on_push, on_state
        self._lock = threading.Lock()
        self._syncs: list[Sync] = []  # round trips asked for, not yet sent
        self._stop = threading.Event()
        self.tracking = False
        self._thread = threading.Thread(target=self._listen, name=f"l1-{name}", daemon=True)

    def start(self) -> Listener:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(5 * _READ_S + 1.0)

    def ask_sync(self, ask: Sync) -> None:
        with self._lock:
            if not self.tracking:
                ask.finish(ok=False)
                return
            self._syncs.append(ask)

    def _state(self, on: bool) -> None:
        with self._lock:
            self.tracking = on
            asked = [] if on else self._syncs
            if not on:
                self._syncs = []
        for ask in asked:
            ask.finish(ok=False)
        self._on_state(self, on)

    def _listen(self) -> None:
        while not self._stop.is_set():
            conn = Connection(**self._kwargs)  # type: ignore[no-untyped-call]
            sent: dict[str, Sync] = {}
            try:
                self._track(conn)
                while not self._stop.is_set():
                    self._send_syncs(conn, sent)
                    if conn.can_read(timeout=_READ_S):
                        reply = conn.read_response(push_request=True)  # pushes call on_push
                        _on_reply(reply, sent)
            except (redis.RedisError, OSError) as exc:
                # Once per loss; the reconnects that fail after it (a dead node) say it quietly.
                lost = log.warning if self.tracking else log.debug
                lost("L1: tracking connection to %s lost (%s); L1 off", self.name, exc)
            finally:
                self._state(False)
                for ask in sent.values():  # their answers are lost with the connection
                    ask.finish(ok=False)
                conn.disconnect()  # type: ignore[no-untyped-call]
            self._stop.wait(_RECONNECT_S)

    def _send_syncs(self, conn: Connection, sent: dict[str, Sync]) -> None:
        with self._lock:
            asked, self._syncs = self._syncs, []
        for ask in asked:
            sent[ask.payload] = ask
            conn.send_command("PING", ask.payload)  # type: ignore[no-untyped-call]

    def _track(self, conn: Connection) -> None:
        conn.connect()  # type: ignore[no-untyped-call]
        conn._parser.set_invalidation_push_handler(self._on_push)
        prefixes = [a for p in self._prefixes for a in ("PREFIX", p)]
        conn.send_command("CLIENT", "TRACKING", "ON", "BCAST", *prefixes)  # type: ignore[no-untyped-call]
        reply = conn.read_response()
        if reply not in (b"OK", "OK"):
            raise redis.ResponseError(f"CLIENT TRACKING answered {reply!r}")
        self._state(True)


def _on_reply(reply: Any, sent: dict[str, Sync]) -> None:
    """A non-push reply on a tracking connection can only answer a sync PING: the server wrote
    every message it queued for us before it."""
    if reply is None:
        return
    payload = reply.decode() if isinstance(reply, bytes) else str(reply)
    ask = sent.pop(payload, None)
    if ask is not None:
        ask.finish(ok=True)


class Topology:
    """Which primaries serve the slots now, and how to connect to each."""

    def __init__(self, r: redis.Redis) -> None:
        self.cluster = slots.is_cluster(r)
        nodes = slots.primaries(r)
        self._base = dict(nodes[0][1].connection_pool.connection_kwargs)
        self._known = [(str(k["host"]), int(k["port"])) for k in (self.kwargs_of(n) for n in nodes)]

    @staticmethod
    def kwargs_of(node: tuple[str, redis.Redis]) -> dict[str, Any]:
        return dict(node[1].connection_pool.connection_kwargs)

    def connect_kwargs(self, name: str) -> dict[str, Any]:
        if not self.cluster:
            return dict(self._base)
        host, _, port = name.rpartition(":")
        return {**self._base, "host": host, "port": int(port)}

    def primaries_now(self) -> list[str] | None:
        """host:port of every primary that serves slots, asked of the first node that answers;
        None if none did (then the caller keeps what it has). One server: always itself."""
        if not self.cluster:
            kw = self._base
            return [f"{kw.get('host', 'unix')}:{kw.get('port', kw.get('path'))}"]
        for host, port in list(self._known):
            try:
                ranges = _cluster_slots(self._base, host, port)
            except (redis.RedisError, OSError):
                continue
            found = sorted({f"{_s(r[2][0])}:{int(r[2][1])}" for r in ranges})
            self._known = sorted(
                {(_s(n[0]), int(n[1])) for r in ranges for n in r[2:]} | set(self._known)
            )
            return found
        return None


def _s(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def _cluster_slots(base: dict[str, Any], host: str, port: int) -> list[Any]:
    kw = {k: v for k, v in base.items() if k not in _DROPPED_KWARGS}
    kw |= {"host": host, "port": port, "socket_timeout": 1.0, "socket_connect_timeout": 0.5}
    conn = Connection(**kw)  # type: ignore[no-untyped-call]
    try:
        conn.send_command("CLUSTER", "SLOTS")  # type: ignore[no-untyped-call]
        return list(conn.read_response())
    finally:
        conn.disconnect()  # type: ignore[no-untyped-call]
