"""The upstream watched after start: an outage shows in /readyz's body and stoker_upstream_up while
the gateway stays ready and serves its cached answers, and the upstream comes back up; a model
the upstream does not list is forwarded with a warning (header, one log line), or refused with
an OpenAI-shaped 404 where strict models are asked for."""

from __future__ import annotations

import logging
from typing import Any

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from gateway.service import GatewayServer
from simulation.backend.http import SimulatorThread
from stoker.embedded import free_port
from tests.gateway.conftest import GatewayFactory, client
from tests.gateway.upstreams import Script, Served, scripted_app
from tests.waiting import wait_for

Q = [{"role": "user", "content": "what are your opening hours"}]
CHECK_S = 0.2  # the tests' check interval: an outage and a return show within a second


def _ready(gw: GatewayServer) -> httpx.Response:
    return httpx.get(gw.url + "/readyz", timeout=5)


def _up_gauge(gw: GatewayServer) -> float | None:
    """stoker_upstream_up for this gateway's upstream, as /metrics serves it."""
    text = httpx.get(gw.url + "/metrics", timeout=5).text
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == "stoker_upstream_up" and s.labels == {"upstream": gw.parts.upstream.shown}:
                return s.value
    return None


def _upstream_is(gw: GatewayServer, state: str) -> bool:
    return bool(_ready(gw).json()["upstream"] == state)


def _ask(gw: GatewayServer, messages: Any = Q, model: str = "scripted") -> Any:
    return client(gw).chat.completions.with_raw_response.create(
        model=model, messages=messages, temperature=0
    )


def test_upstream_health__an_outage_keeps_the_gateway_ready_and_serving_its_hits(
    make_gateway: GatewayFactory, script: Script
) -> None:
    port = free_port()
    with Served(scripted_app(script), port=port) as up:
        gw = make_gateway(up.url + "/v1", gateway_upstream_check_s=CHECK_S)
        assert _ask(gw).headers["x-stoker-cache"] == "miss"
        wait_for(lambda: _upstream_is(gw, "up"), 10, "the upstream to show up")
        assert _up_gauge(gw) == 1.0
    wait_for(lambda: _upstream_is(gw, "down"), 10, "the stopped upstream to show down")
    ready = _ready(gw)
    assert ready.status_code == 200 and ready.json()["status"] == "ready", ready.text
    assert ready.json()["upstream_url"] == f"{up.url}/v1"
    assert f"GET {up.url}/v1/models failed" in ready.json()["upstream_detail"]
    assert _up_gauge(gw) == 0.0
    hit = _ask(gw)  # the cached answer, with the upstream down
    assert hit.headers["x-stoker-cache"] == "exact"
    assert hit.parse().choices[0].message.content == script.text
    with pytest.raises(openai.APIStatusError) as e:  # a miss has nowhere to go
        _ask(gw, [{"role": "user", "content": "and on sundays"}])
    assert e.value.status_code == 502
    with Served(scripted_app(script), port=port):
        wait_for(lambda: _upstream_is(gw, "up"), 10, "the restarted upstream to show up")
        assert _up_gauge(gw) == 1.0
        back = _ask(gw, [{"role": "user", "content": "and on mondays"}])
        assert back.headers["x-stoker-cache"] == "miss"
    assert script.calls() == 2


def test_upstream_health__a_request_that_finds_it_gone_marks_it_down_before_the_next_check(
    make_gateway: GatewayFactory, script: Script
) -> None:
    """The periodic check is an hour away; the request's failure makes the gateway ask at once."""
    with Served(scripted_app(script)) as up:
        gw = make_gateway(up.url, gateway_upstream_check_s=3_600)
        wait_for(lambda: _upstream_is(gw, "up"), 10, "the first check")
    with pytest.raises(openai.APIStatusError):
        _ask(gw)
    wait_for(lambda: _upstream_is(gw, "down"), 10, "the outage to show")


def test_upstream_health__an_unlisted_model_is_forwarded_with_a_warning_logged_once(
    make_gateway: GatewayFactory, sim: SimulatorThread, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="gateway")
    gw = make_gateway(sim.url)
    wait_for(lambda: gw.parts.health.models is not None, 10, "the upstream's models")
    said = f"model 'gpt-4o' is not listed by the upstream {gw.parts.upstream.shown}"
    for n in range(3):
        asked = _ask(gw, [{"role": "user", "content": f"question {n}"}], model="gpt-4o")
        assert asked.headers["x-stoker-warning"] == said
        assert asked.parse().choices[0].message.content  # the upstream answered it
    listed = _ask(gw, model="sim-model")
    assert "x-stoker-warning" not in listed.headers
    lines = [r.getMessage() for r in caplog.records if "'gpt-4o'" in r.getMessage()]
    assert len(lines) == 1, lines
    assert lines[0].startswith(said + " (it serves: sim-model); forwarded as asked")


def test_upstream_health__strict_models_refuse_an_unlisted_one_with_an_openai_404(
    make_gateway: GatewayFactory, sim: SimulatorThread
) -> None:
    gw = make_gateway(sim.url, gateway_strict_models=True)
    wait_for(lambda: gw.parts.health.models is not None, 10, "the upstream's models")
    c = client(gw)
    with pytest.raises(openai.NotFoundError) as e:
        c.chat.completions.create(model="gpt-4o", messages=Q, temperature=0)
    assert e.value.body == {
        "message": f"model 'gpt-4o' is not listed by the upstream {gw.parts.upstream.shown}, "
        "which serves: sim-model",
        "type": "invalid_request_error", "param": "model", "code": "model_not_found",
    }  # fmt: skip
    with pytest.raises(openai.NotFoundError):
        c.embeddings.create(model="text-embedding-3-small", input="hello")
    assert c.chat.completions.create(model="sim-model", messages=Q, temperature=0).choices


def test_upstream_health__a_model_name_no_header_can_carry_is_quoted_printable(
    make_gateway: GatewayFactory, sim: SimulatorThread
) -> None:
    gw = make_gateway(sim.url)
    wait_for(lambda: gw.parts.health.models is not None, 10, "the upstream's models")
    asked = _ask(gw, model="modèle\r\nx-evil: 1" + "y" * 200)
    warning = asked.headers["x-stoker-warning"]
    assert warning.startswith("model 'mod?le??x-evil: 1yyy") and "x-evil" not in asked.headers
    assert "...' is not listed" in warning
