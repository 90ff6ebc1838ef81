"""`stoker gateway` as users run it, and invalidations reaching the vectors it serves."""

from __future__ import annotations

import re
import signal
import socket
import subprocess
import threading
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import redis

from gateway.service import GatewayServer
from schemas.events import KnowledgeBaseChanged
from simulation.backend.http import SimulatorThread
from stoker.runtime import WorkerGroup
from stoker.settings import StokerSettings
from stoker.stack import Stack
from tests.cli import STOKER, clean_env
from tests.gateway.conftest import client
from tests.gateway.upstreams import Script, Served
from tests.waiting import wait_for

BANNER = re.compile(r"gateway on (http://127\.0\.0\.1:\d+)")
Q = [{"role": "user", "content": "how do i reset my password"}]
PARAPHRASE = [{"role": "user", "content": "How can I reset my password?"}]
DOCS = {"stoker": {"docs": [{"doc_id": "kb/reset"}]}}


class Running:
    """`stoker gateway ...` as a child process; its banner tells the URL."""

    def __init__(self, args: list[str], env: dict[str, str]) -> None:
        self.proc = subprocess.Popen(
            [*STOKER, "gateway", *args], env=clean_env(env), stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip
        self.lines: list[str] = []
        self.url = ""
        threading.Thread(target=self._read, daemon=True).start()
        wait_for(lambda: self.url or self.proc.poll() is not None, 120, "the gateway banner")
        assert self.url, "".join(self.lines)

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line)
            m = BANNER.search(line)
            if m:
                self.url = m.group(1)

    def stop(self, timeout_s: float = 60) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout_s)


@pytest.fixture
def running() -> Any:
    started: list[Running] = []

    def start(args: list[str], env: dict[str, str]) -> Running:
        r = Running(args, env)
        started.append(r)
        return r

    yield start
    for r in started:
        if r.proc.poll() is None:
            r.proc.kill()
            r.proc.wait(10)


def _ask(url: str, messages: list[dict[str, Any]] = Q, **kw: Any) -> Any:
    c = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0,
                      default_headers={"X-Stoker-Tenant": "acme"})  # fmt: skip
    return c.chat.completions.with_raw_response.create(
        model="sim-model", messages=messages, temperature=0, **kw
    )


def test_cli__one_command_on_the_embedded_stack_serves_and_drains_on_sigterm(
    running: Any, sim: SimulatorThread
) -> None:
    gw = running(["--port", "0", "--upstream", sim.url], {"COLUMNS": "80"})  # as in a log file
    # the banner's URLs whole, each on its line (at 80 columns the base URL was broken in two)
    base = ["OpenAI", "base", "URL:", f"{gw.url}/v1"]
    wait_for(lambda: any(ln.split() == base for ln in gw.lines), 10, "the base URL's line")
    at = next(i for i, ln in enumerate(gw.lines) if BANNER.search(ln))
    banner = gw.lines[at : at + 3]
    assert banner[1].split() == ["upstream:", f"{sim.url}/v1"]
    assert all(len(ln.rstrip("\n")) <= 80 for ln in banner), banner
    # the embedded stack's addresses, each whole on a line of its own (one long line ran on)
    at = next(i for i, ln in enumerate(gw.lines) if "an embedded stack" in ln)
    stack = [ln.split() for ln in gw.lines[at + 1 : at + 4]]
    assert stack[0][0] == "Kafka:" and stack[0][1].startswith("127.0.0.1:"), stack
    assert stack[1][0] == "Redis:" and stack[1][1].startswith("redis://127.0.0.1:"), stack
    assert stack[2][:2] == ["addresses", "in:"] and Path(stack[2][2]).is_file(), stack
    assert all(len(ln.rstrip("\n")) <= 80 for ln in gw.lines[at : at + 3]), gw.lines[at : at + 3]
    assert any("workers in this process" in ln for ln in gw.lines)
    # the workers warm the upstream it serves from (not STOKER_WARM_BACKEND_URL's default, where
    # nothing listens): their start-up check finds nothing that does not answer
    assert any(ln.startswith("answering: Kafka at ") for ln in gw.lines), gw.lines
    assert not any("does not answer" in ln for ln in gw.lines), gw.lines
    assert _ask(gw.url).headers["x-stoker-cache"] == "miss"
    wait_for(lambda: _ask(gw.url).headers["x-stoker-cache"] == "exact", 10, "the hit")
    assert gw.stop() == 0
    assert any("gateway stopped" in ln for ln in gw.lines)


def test_cli__with_nothing_set_it_serves_the_embedded_real_model(running: Any) -> None:
    """No upstream, no Kafka, no Redis: one command runs the stack and a real model server
    (llama-server, SmolLM2) behind the gateway, and stops them all on SIGTERM."""
    gw = running(["--port", "0"], {})
    said = "".join(gw.lines)
    model_url = re.search(r"^  model server: (http://127\.0\.0\.1:\d+/v1)$", said, re.M)
    assert model_url, said
    listed = openai.OpenAI(base_url=gw.url + "/v1", api_key="x", max_retries=0).models.list()
    assert [m.id for m in listed] == ["smollm2-135m-instruct"]  # the upstream's own list
    assert "requests without an x-stoker-tenant header are tenant 'default'" in said
    # a newcomer's first request carries no tenant header: on a stack of its own it is served
    newcomer = openai.OpenAI(base_url=gw.url + "/v1", api_key="x", max_retries=0)
    # a one-word answer ends by itself: one cut at max_tokens would not be stored
    hello = [{"role": "user", "content": "Answer with one word: what is the capital of France?"}]
    ask = newcomer.chat.completions.with_raw_response.create
    first = ask(model="m", messages=hello, temperature=0, max_tokens=32)  # type: ignore[arg-type]
    answer = first.parse()
    assert first.headers["x-stoker-cache"] == "miss" and answer.choices[0].message.content
    assert (answer.model_extra or {}).get("timings"), "not llama-server's answer"
    assert answer.choices[0].finish_reason == "stop", answer
    stored = re.compile(r'^stoker_gateway_stores_total\{result="landed"\} [1-9]', re.M)
    wait_for(lambda: stored.search(httpx.get(gw.url + "/metrics").text), 10, "the answer to land")
    again = ask(model="m", messages=hello, temperature=0, max_tokens=32)  # type: ignore[arg-type]
    assert again.headers["x-stoker-cache"] == "exact"
    assert again.parse().choices[0].message.content == answer.choices[0].message.content
    # a named tenant's cache is its own: the default tenant's answer is not served to it
    other = _ask(gw.url, hello, max_tokens=32)
    assert other.headers["x-stoker-cache"] != "exact"
    assert gw.stop() == 0
    port = int(model_url.group(1).rsplit(":", 1)[1].split("/")[0])
    with socket.socket() as sock:  # the model server stopped with the gateway
        assert sock.connect_ex(("127.0.0.1", port)) != 0


def test_cli__a_request_sent_before_serving_starts_is_answered_not_refused(
    sim: SimulatorThread, redis_url: str, tmp_path: Path, unique: str
) -> None:
    """The CLI prints its banner before uvicorn serves (workers and lifespan start between):
    a client told the URL may connect at once. It waits in the listen queue, not refused."""
    s = StokerSettings(redis_url=redis_url, qdrant_path=tmp_path / "q",
                       gateway_default_temperature=0)  # fmt: skip
    stack = Stack(s)
    server = GatewayServer(stack.gateway(upstream_url=sim.url))
    done: list[str] = []

    def early() -> None:
        asked = [{"role": "user", "content": f"is anyone there {unique}"}]
        done.append(_ask(server.url, asked).headers["x-stoker-cache"])

    t = threading.Thread(target=early)
    t.start()
    with socket.create_connection((server.host, server.port), timeout=5):
        pass  # connected before serve(): the port listens already
    with stack, server:
        t.join(30)
    assert done == ["miss"]


def test_cli__sigterm_lets_the_request_in_flight_finish(
    running: Any, script: Script, scripted: Served, redis_url: str
) -> None:
    script.delay_s = 1.5
    gw = running(["--port", "0", "--upstream", scripted.url], {"STOKER_REDIS_URL": redis_url})
    done: list[int] = []

    def slow() -> None:
        done.append(_ask(gw.url).http_response.status_code)

    t = threading.Thread(target=slow)
    t.start()
    wait_for(lambda: script.calls() == 1, 10, "the request to reach the upstream")
    gw.proc.send_signal(signal.SIGTERM)
    t.join(30)
    assert done == [200]
    assert gw.stop() == 0


@pytest.mark.parametrize("args", [["--port", "70000"], ["--upstream", "ftp://x"], ["--bogus"]])
def test_cli__bad_arguments_exit_2(args: list[str]) -> None:
    out = subprocess.run([*STOKER, "gateway", *args], env=clean_env(), capture_output=True,
                         text=True, timeout=60)  # fmt: skip
    assert out.returncode == 2, out.stderr


@pytest.mark.parametrize("backend", ["edge", "server"])
def test_cli__an_invalidation_reaches_the_vectors_the_gateway_serves(
    backend: str,
    sim: SimulatorThread,
    kafka_bootstrap: str,
    redis_url: str,
    redis_client: redis.Redis,
    tmp_path: Path,
    unique: str,
) -> None:
    """The gateway and the invalidation worker of one process share one semantic store: the
    embedded set-up (Qdrant Edge) and the server set-up (qdrant-client; here its local mode,
    which stands in for a Qdrant server: a real server across processes is not run here)."""
    semantic: dict[str, Any] = (
        {"qdrant_path": tmp_path / "edge"} if backend == "edge"
        else {"semantic_backend": "server", "qdrant_url": ":memory:",
              "qdrant_collection": f"c{unique}"}
    )  # fmt: skip
    s = StokerSettings(
        kafka_bootstrap=kafka_bootstrap, kafka_broker="tansu", topic_prefix=f"inv{unique}.",
        redis_url=redis_url, gateway_default_temperature=0, semantic_threshold=0.9,
        semantic_matcher="static", worker_poll_s=0.05, **semantic,
        gateway_lookup_budget_ms=1000,  # the paraphrase's embedding can pass 50 ms under load
    )  # fmt: skip
    stack = Stack(s)  # one process: the gateway and its invalidation worker share the store
    workers = WorkerGroup(stack, ["invalidation"])
    workers.start()
    try:
        with GatewayServer(stack.gateway(upstream_url=sim.url)) as gw:
            c = client(gw)
            store = gw.parts.gate.cache.semantic
            assert store is not None
            c.chat.completions.create(model="sim-model", messages=Q, temperature=0, extra_body=DOCS)
            wait_for(lambda: store.count({"tenant": "acme"}) == 1, 10, "the vector to be indexed")
            hit = _ask(gw.url, PARAPHRASE, extra_body=DOCS)
            assert hit.headers["x-stoker-cache"] == "semantic"
            with stack.publisher as pub:
                ev = KnowledgeBaseChanged(tenant="acme", doc_id="kb/reset", doc_version=2,
                                          change="updated")  # fmt: skip
                pub.publish("inference.kb-changes", ev, key="acme")
                pub.flush()
            wait_for(lambda: store.count({"tenant": "acme"}) == 0, 30, "the vector to be deleted")
            assert redis_client.keys("stk:{t:acme}:e:*") == []
            assert _ask(gw.url, PARAPHRASE, extra_body=DOCS).headers["x-stoker-cache"] == "miss"
    finally:
        workers.join()
        stack.close()
    assert not workers.errors
