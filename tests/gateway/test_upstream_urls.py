"""Upstream base URLs as users write them: the openai SDK through the gateway to real upstreams
at `http://host:port`, `.../v1`, `.../v1/` and a path prefix; a malformed URL stops the start
(exit 2, one line); a refused connection is a 502 whose log line names the URL; the start-up
probe says what answered, and an upstream that starts later is served once it does."""

from __future__ import annotations

import logging
from typing import Any

import openai
import pytest
from starlette.applications import Starlette
from starlette.routing import Mount

from stoker.embedded import free_port
from tests.cli import run_stoker
from tests.gateway.conftest import GatewayFactory, client
from tests.gateway.test_gateway_cli import Running
from tests.gateway.upstreams import Script, Served, scripted_app
from tests.waiting import wait_for

Q = [{"role": "user", "content": "what are your opening hours"}]


def _prefixed(script: Script) -> Starlette:
    """The scripted upstream behind a path prefix, as a proxy or an ingress mounts a server."""
    return Starlette(routes=[Mount("/llm", app=scripted_app(script))])


@pytest.mark.parametrize(
    ("prefix", "written"),
    [
        ("", "{url}"),
        ("", "{url}/"),
        ("", "{url}/v1"),
        ("", "{url}/v1/"),
        ("/llm", "{url}/llm/v1"),
        ("/llm", "{url}/llm/v1/"),
    ],
)
def test_upstream_url__the_sdk_through_the_gateway_reaches_an_upstream_written_any_way(
    make_gateway: GatewayFactory, script: Script, prefix: str, written: str
) -> None:
    app = _prefixed(script) if prefix else scripted_app(script)
    with Served(app) as up:
        gw = make_gateway(written.format(url=up.url))
        c = client(gw)
        assert [m.id for m in c.models.list().data] == ["scripted"]
        answer = c.chat.completions.create(model="m", messages=Q, temperature=0)
        assert answer.choices[0].message.content == script.text
        streamed = c.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "and on sundays"}],
            temperature=0, stream=True,
        )  # fmt: skip
        text = "".join(ch.choices[0].delta.content or "" for ch in streamed if ch.choices)
        assert text == script.text
        wait_for(lambda: gw.parts.health.probed, 10, "the start-up probe")
        assert gw.parts.health.probed == f"upstream {up.url}{prefix}/v1: serves 1 model: scripted"
    assert script.calls() == 2


def test_upstream_url__a_refused_connection_is_a_502_whose_log_line_names_the_url(
    make_gateway: GatewayFactory, caplog: pytest.LogCaptureFixture
) -> None:
    url = f"http://127.0.0.1:{free_port()}/v1"
    gw = make_gateway(url)
    caplog.set_level(logging.WARNING, logger="gateway")
    for n in range(3):  # an outage is one log line, not one per request
        asked = [{"role": "user", "content": f"question {n}"}]  # not the negative cache's
        with pytest.raises(openai.APIStatusError) as e:
            client(gw).chat.completions.create(model="m", messages=asked, temperature=0)
        assert e.value.status_code == 502 and e.value.body["type"] == "upstream_error"
    with pytest.raises(openai.APIStatusError) as models:
        client(gw).models.list()
    assert models.value.status_code == 502
    failed = [r.getMessage() for r in caplog.records if "failed:" in r.getMessage()]
    assert len(failed) == 1, failed
    assert failed[0].startswith(f"upstream {url}/chat/completions failed: ")
    assert failed[0].endswith("answered 502")


def test_upstream_url__an_upstream_that_starts_after_the_gateway_is_served_once_it_does(
    make_gateway: GatewayFactory, script: Script
) -> None:
    port = free_port()
    gw = make_gateway(f"http://127.0.0.1:{port}/v1")
    wait_for(lambda: gw.parts.health.probed, 10, "the start-up probe")
    assert f"GET http://127.0.0.1:{port}/v1/models failed" in gw.parts.health.probed
    assert "starts later is fine" in gw.parts.health.probed
    with Served(scripted_app(script), port=port):
        answer = client(gw).chat.completions.create(model="m", messages=Q, temperature=0)
    assert answer.choices[0].message.content == script.text


def test_upstream_url__a_base_without_its_v1_is_told_by_the_probe(
    make_gateway: GatewayFactory, script: Script
) -> None:
    with Served(_prefixed(script)) as up:
        gw = make_gateway(f"{up.url}/llm")  # the prefix, without the /v1 the server needs
        wait_for(lambda: gw.parts.health.probed, 10, "the start-up probe")
    assert f"GET {up.url}/llm/models answered 404" in gw.parts.health.probed
    assert "often /v1" in gw.parts.health.probed


@pytest.mark.parametrize(
    ("args", "env", "says"),
    [
        (["--upstream", "127.0.0.1:8002"], {}, "e.g. http://127.0.0.1:8002/v1"),
        (["--upstream", "http://127.0.0.1:99999/v1"], {}, "bad port"),
        ([], {"STOKER_GATEWAY_UPSTREAM_URL": "localhost:8002/v1"}, "STOKER_GATEWAY_UPSTREAM_URL"),
        ([], {"STOKER_WARM_BACKEND_URL": "http://h/v1?x=1"}, "STOKER_WARM_BACKEND_URL"),
    ],
)
def test_upstream_url__a_malformed_one_stops_the_start_with_one_line_and_exit_2(
    args: list[str], env: dict[str, str], says: str
) -> None:
    res = run_stoker("gateway", "--port", "0", *args, env=env)
    assert res.returncode == 2, res.stderr
    assert says in " ".join(res.stderr.split()), res.stderr
    assert "Traceback" not in res.stderr


def test_upstream_url__stoker_gateway_with_a_v1_upstream_serves_models_and_chat(
    script: Script, scripted: Served, redis_url: str
) -> None:
    """The repro: `stoker gateway --upstream http://127.0.0.1:8002/v1` answered every request,
    /v1/models included, with a 500 (aiohttp: base_url must have a trailing '/')."""
    env = {"STOKER_REDIS_URL": redis_url, "STOKER_SEMANTIC_ENABLED": "false"}  # no model to load
    gw = Running(["--port", "0", "--upstream", scripted.url + "/v1"], env)
    try:
        c = openai.OpenAI(base_url=gw.url + "/v1", api_key="x", max_retries=0,
                          default_headers={"X-Stoker-Tenant": "acme"})  # fmt: skip
        assert [m.id for m in c.models.list().data] == ["scripted"]
        answer: Any = c.chat.completions.create(model="m", messages=Q, temperature=0)
        assert answer.choices[0].message.content == script.text
        wait_for(lambda: any("serves 1 model" in ln for ln in gw.lines), 10, "the probe's line")
        assert any(f"upstream:        {scripted.url}/v1\n" in ln for ln in gw.lines), gw.lines
    finally:
        assert gw.stop() == 0, "".join(gw.lines)
