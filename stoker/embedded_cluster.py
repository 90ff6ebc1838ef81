"""A real Redis Cluster on loopback: redis-server children joined by CLUSTER commands.

Formed the way `redis-cli --cluster create` forms one, without needing redis-cli:
1. start every node with cluster mode on, each in its own temp dir (nodes.conf lives there);
2. give each node its own config epoch, and each primary an equal share of the 16384 slots;
3. CLUSTER MEET every node from the first, and wait until every node knows every other;
4. CLUSTER REPLICATE each replica to its primary, and wait until every node says
   cluster_state:ok and every replica's link to its primary is up.
For tests and benchmarks (stoker never starts one for production: point STOKER_REDIS_URL at
yours as redis+cluster://host:port).
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from schemas.errors import ServiceStartError
from stoker.embedded import LOOPBACK, ChildStack, RedisServer

SLOTS = 16_384
# How long a node may be unreachable before it is marked failed and its replica takes over.
# Redis' default is 15 s; 2 s makes the failover test take seconds, and is still 20x the
# longest stall of a node measured here under the full suite (~0.1 s).
NODE_TIMEOUT_MS = 2_000
# Gossip converges in ~1 s on loopback; 20 s covers a loaded 2-core CI runner.
FORM_TIMEOUT_S = 20.0
_POLL_S = 0.05
# Redis 6.2 puts a node's cluster bus on port + 10000 (no cluster-port setting before 7.0), so
# both must be free. Client ports from 11000 to 22000 keep both below Linux's ephemeral range
# (32768+), where an outgoing connection could take one meanwhile.
_BUS_OFFSET = 10_000
_PORT_RANGE = (11_000, 22_000)
_PORT_TRIES = 200


def _bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((LOOPBACK, port))
        except OSError:
            return False
    return True


def free_bus_port() -> int:
    """A client port that is free, and whose cluster bus port (+10000) is free too."""
    for _ in range(_PORT_TRIES):
        port = random.randrange(*_PORT_RANGE)
        if _bindable(port) and _bindable(port + _BUS_OFFSET):
            return port
    raise ServiceStartError(f"no free port pair (p, p+{_BUS_OFFSET}) in {_PORT_RANGE}")


class ClusterNode(RedisServer):
    """One redis-server with cluster mode on (persistence still off)."""

    name = "redis-cluster-node"

    def pick_port(self) -> int:
        return free_bus_port()

    def argv(self, port: int, workdir: Path) -> list[str]:
        return [
            *super().argv(port, workdir),
            *("--cluster-enabled", "yes", "--cluster-config-file", str(workdir / "nodes.conf")),
            *("--cluster-node-timeout", str(NODE_TIMEOUT_MS)),
        ]

    def kill(self) -> None:
        """SIGKILL, as a crash would: no shutdown, no goodbye to the cluster (stop() still
        removes the temp dir)."""
        proc, self._proc = self._proc, None
        if proc is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()

    def client(self) -> redis.Redis:
        """A plain connection to this node alone (no redirects followed)."""
        return redis.Redis(
            host=LOOPBACK,
            port=self.port,
            socket_connect_timeout=1,
            socket_timeout=5,
            retry=Retry(NoBackoff(), retries=0),
            decode_responses=True,
        )


class EmbeddedCluster(ChildStack):
    """`primaries` primaries with `replicas` replicas each, for one `with` block.

    Invariant, as EmbeddedStack's: once the block is left no node runs and no temp dir is left.
    """

    def __init__(self, primaries: int = 3, replicas: int = 1) -> None:
        if primaries < 1 or replicas < 0:
            raise ValueError("a cluster needs >= 1 primary and >= 0 replicas per primary")
        self.primaries = [ClusterNode() for _ in range(primaries)]
        self.replicas = [[ClusterNode() for _ in range(replicas)] for _ in range(primaries)]

    @property
    def nodes(self) -> list[ClusterNode]:
        return [*self.primaries, *(n for group in self.replicas for n in group)]

    @property
    def url(self) -> str:
        """What STOKER_REDIS_URL takes: one seed node; the client discovers the rest."""
        return f"redis+cluster://{LOOPBACK}:{self.primaries[0].port}"

    @property
    def seeds_url(self) -> str:
        """Every primary as a seed: a client starts while any one of them answers."""
        seeds = ",".join(f"{LOOPBACK}:{n.port}" for n in self.primaries)
        return f"redis+cluster://{seeds}"

    def _start(self) -> None:
        for node in self.nodes:
            node.launch()
        for node in self.nodes:
            node.wait_ready()
        self._form()

    def _stop(self) -> None:
        for node in self.nodes:
            node.stop()

    # -- forming --

    def _form(self) -> None:
        clients = [n.client() for n in self.nodes]
        try:
            for epoch, c in enumerate(clients, start=1):
                _cmd(c, "CLUSTER", "SET-CONFIG-EPOCH", epoch)
            for share, c in zip(_slot_shares(len(self.primaries)), clients, strict=False):
                _cmd(c, "CLUSTER", "ADDSLOTS", *share)
            for node in self.nodes[1:]:
                _cmd(clients[0], "CLUSTER", "MEET", LOOPBACK, node.port)
            self._wait("every node to know every other", lambda: _all_know(clients))
            ids = [_cmd(c, "CLUSTER", "MYID") for c in clients[: len(self.primaries)]]
            for primary_id, group in zip(ids, self.replicas, strict=True):
                for node in group:
                    with node.client() as c:
                        _cmd(c, "CLUSTER", "REPLICATE", primary_id)
            self._wait("cluster_state:ok on every node", lambda: self.healthy(clients))
        finally:
            for c in clients:
                c.close()

    def healthy(self, clients: list[redis.Redis] | None = None) -> bool:
        """Every running node says cluster_state:ok and every running replica's link is up."""
        own = clients is None
        clients = clients or [n.client() for n in self.nodes if n.pid is not None]
        try:
            return all(_node_ok(c) for c in clients)
        except redis.RedisError:
            return False
        finally:
            if own:
                for c in clients:
                    c.close()

    def _wait(self, what: str, done: Callable[[], bool]) -> None:
        deadline = time.monotonic() + FORM_TIMEOUT_S
        while not done():
            if time.monotonic() > deadline:
                tails = "\n".join(n.log_tail()[-600:] for n in self.nodes)
                raise ServiceStartError(
                    f"redis cluster: no {what} within {FORM_TIMEOUT_S:g} s; logs end:\n{tails}"
                )
            time.sleep(_POLL_S)

    # -- for the failover test --

    def primary_of(self, slot: int) -> ClusterNode:
        """The node serving `slot` now (asked of any live node)."""
        for node in self.nodes:
            if node.pid is None:
                continue
            with contextlib.suppress(redis.RedisError), node.client() as c:
                for start, end, owner, *_ in _cmd(c, "CLUSTER", "SLOTS"):
                    if start <= slot <= end:
                        port = int(owner[1])
                        return next(n for n in self.nodes if n.port == port)
        raise RuntimeError(f"no live node knows who serves slot {slot}")


def _slot_shares(n: int) -> list[list[int]]:
    """16384 slots in n contiguous ranges, as redis-cli splits them."""
    bounds = [round(i * SLOTS / n) for i in range(n + 1)]
    return [list(range(bounds[i], bounds[i + 1])) for i in range(n)]


def _all_know(clients: list[redis.Redis]) -> bool:
    want = len(clients)
    for c in clients:
        lines = str(_cmd(c, "CLUSTER", "NODES")).strip().splitlines()
        if len(lines) < want or any("handshake" in line for line in lines):
            return False
    return True


def _node_ok(c: redis.Redis) -> bool:
    info = str(_cmd(c, "CLUSTER", "INFO"))
    if "cluster_state:ok" not in info:
        return False
    repl = c.info("replication")
    return repl.get("role") != "slave" or repl.get("master_link_status") == "up"


def _cmd(c: redis.Redis, *args: Any) -> Any:
    """One command to this node alone (redis-py leaves execute_command untyped)."""
    return c.execute_command(*args)  # type: ignore[no-untyped-call]
