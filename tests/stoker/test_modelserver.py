"""The embedded real model: llama-server built by `make setup`, started on a free port, and the
bad cases a user meets (no compiler, a download that fails its hash, a port in use, a server
that dies at start), each in one line."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from openai import OpenAI

from schemas.errors import ServiceStartError
from stoker import modelserver
from stoker.embedded import LOOPBACK, LlamaServer, free_port
from stoker.modelserver import MODEL_ALIAS, Pin, ServeOptions, SetupError
from tests.cli import ROOT, run_stoker, running_stoker
from tests.waiting import wait_for


def test_llama__answers_the_openai_sdk_with_usage_and_timings(llama: LlamaServer) -> None:
    client = OpenAI(base_url=llama.base_url, api_key="none", max_retries=0)
    assert [m.id for m in client.models.list()] == [MODEL_ALIAS]
    r = client.chat.completions.create(
        model=MODEL_ALIAS,
        messages=[{"role": "user", "content": "Name a colour."}],
        temperature=0,
        max_tokens=8,
    )
    assert r.choices[0].message.content
    assert r.usage is not None and 0 < r.usage.completion_tokens <= 8
    timings = (r.model_extra or {})["timings"]  # what a miss costs, as the server measured it
    assert timings["prompt_ms"] > 0 and timings["predicted_ms"] > 0


def test_llama__kv_bytes_a_token_are_what_the_server_allocates(tmp_path: Path) -> None:
    """The prefix warm's default host-cache tokens divide --cache-ram by
    ServeOptions.kv_bytes_per_token: the server's own figure, from the KV cache it allocates at
    start (a line it prints with -lv 4: S seqs of N cells, X MiB in all)."""
    o, found = ServeOptions(), _installed()
    argv = [str(found.server), "-m", str(found.model), "--port", str(free_port())]
    argv += ["-t", "1", "-np", str(o.parallel), "-c", str(o.ctx), "-lv", "4"]
    log = tmp_path / "server.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)
        try:
            pattern = r"llama_kv_cache: size = +([0-9.]+) MiB \( *(\d+) cells, +\d+ layers, +(\d+)/"
            read = lambda: re.search(pattern, log.read_text(errors="replace"))  # noqa: E731
            wait_for(read, 60.0, "llama-server's KV cache line", interval_s=0.1)
        finally:
            proc.kill()
            proc.wait(10)
    got = read()
    assert got is not None
    mib, cells, seqs = float(got[1]), int(got[2]), int(got[3])
    assert mib * 2**20 / (cells * seqs) == o.kv_bytes_per_token


def test_setup__no_cmake_says_what_to_install(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    empty = tmp_path / "bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")
    with pytest.raises(SetupError, match=r"cmake .*not on PATH.*STOKER_LLAMA_SERVER_BIN"):
        modelserver.ensure(tmp_path / "cache", model=model, say=lambda _: None)


def test_setup__a_download_that_fails_its_hash_is_refused(tmp_path: Path) -> None:
    # A small wheel pip can fetch from the configured index, pinned to a wrong hash.
    wrong = Pin("six", "1.16.0", "0" * 64, sdist=False)
    with pytest.raises(
        SetupError, match=r"six-1\.16\.0.*failed its hash check: sha256 [0-9a-f]{64}"
    ):
        modelserver.fetch(wrong, tmp_path, say=lambda _: None)


def test_setup__given_paths_that_do_not_exist_name_the_setting(tmp_path: Path) -> None:
    with pytest.raises(SetupError, match=r"STOKER_LLAMA_SERVER_BIN=.*no such file"):
        modelserver.ensure(tmp_path, server=tmp_path / "nope", model=tmp_path / "nope.gguf")


def _early_build(cache: Path, path: str) -> subprocess.CompletedProcess[str]:
    """What bootstrap.sh starts before pip has installed anything: -S, no site-packages."""
    return subprocess.run(
        [sys.executable, "-S", "-m", "stoker.modelserver", str(cache)], cwd=ROOT,
        env={"PATH": path, "HOME": str(cache)}, capture_output=True, text=True, timeout=60,
    )  # fmt: skip


def test_setup__the_early_build_needs_only_the_standard_library(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    for built in (modelserver.server_path(cache), modelserver.model_path(cache)):
        built.parent.mkdir(parents=True, exist_ok=True)
        built.write_bytes(b"built before")
    modelserver.server_path(cache).chmod(0o755)
    proc = _early_build(cache, os.environ["PATH"])
    # found built, so nothing to say (an import beyond the standard library would fail here)
    assert (proc.returncode, proc.stderr) == (0, "")


def test_setup__the_early_build_leaves_a_failure_to_model_setup(tmp_path: Path) -> None:
    """No cmake: exit 1 and not a word (`stoker model setup` runs next and says it, once)."""
    empty = tmp_path / "bin"
    empty.mkdir()
    proc = _early_build(tmp_path / "cache", str(empty))
    assert (proc.returncode, proc.stdout, proc.stderr) == (1, "", "")


def _installed() -> modelserver.Installed:
    return modelserver.installed(modelserver.cache_root(None))


def test_llama__a_port_in_use_is_one_line(tmp_path: Path) -> None:
    got = _installed()
    with socket.socket() as taken:
        taken.bind((LOOPBACK, 0))
        taken.listen()
        port = taken.getsockname()[1]
        server = LlamaServer(got.server, got.model, ServeOptions(port=port))
        with pytest.raises(ServiceStartError, match=f"port {port} on 127.0.0.1 is in use"):
            server.start()
    assert not server.alive


def test_llama__a_server_that_dies_at_start_says_why(tmp_path: Path) -> None:
    bad = tmp_path / "broken.gguf"
    bad.write_bytes(b"this is not a model")
    server = LlamaServer(_installed().server, bad, ServeOptions(start_timeout_s=60))
    with pytest.raises(ServiceStartError) as e:
        server.start()
    message = str(e.value)
    assert "exited with code" in message and "\n" not in message
    assert "model" in message.split("it said:")[1].lower()  # llama-server's own reason


def test_model_serve__serves_then_stops_on_sigterm() -> None:
    with running_stoker("model", "serve", env={"COLUMNS": "200"}) as (proc, lines):
        wait_for(
            lambda: any("OpenAI base URL" in ln for ln in lines) or proc.poll() is not None,
            timeout_s=120,
            what="stoker model serve's URL line",
        )
        line = next(ln for ln in lines if "OpenAI base URL" in ln)
        url = next(w for w in line.split() if w.startswith("http://"))
        client = OpenAI(base_url=url, api_key="none", max_retries=0)
        assert [m.id for m in client.models.list()] == [MODEL_ALIAS]
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
    port = int(url.rsplit(":", 1)[1].split("/")[0])
    with socket.socket() as s:  # the server went with it: its port no longer answers
        assert s.connect_ex((LOOPBACK, port)) != 0


def test_model_serve__a_port_in_use_exits_2(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind((LOOPBACK, 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = run_stoker("model", "serve", "--port", str(port), env={"COLUMNS": "80"})
    assert proc.returncode == 2
    assert f"--port {port}: in use" in proc.stderr
