"""Every route, and every bad request answered with an OpenAI-shaped error and its status."""

from __future__ import annotations

import base64
from typing import Any

import httpx
import numpy as np
import openai
import pytest
import redis

from gateway.service import GatewayServer
from simulation.backend.http import SimulatorThread
from tests.gateway.conftest import GatewayFactory, client
from tests.gateway.upstreams import Served
from tests.waiting import wait_for


def _error(resp: httpx.Response) -> dict[str, Any]:
    body = resp.json()
    assert set(body) == {"error"} and {"message", "type", "param", "code"} <= set(body["error"])
    return dict(body["error"])


@pytest.fixture
def gw(make_gateway: GatewayFactory, sim: SimulatorThread) -> GatewayServer:
    return make_gateway(sim.url, gateway_max_body_bytes=64 * 1024)


@pytest.mark.parametrize(
    ("body", "status", "param"),
    [
        (b"{not json", 400, None),
        (b"[1, 2]", 400, None),
        (b'{"messages": [{"role": "user", "content": "q"}]}', 400, "model"),
        (b'{"model": "m"}', 400, "messages"),
        (b'{"model": "m", "messages": []}', 400, "messages"),
        (b'{"model": "m", "messages": [{"content": "q"}]}', 400, "messages"),
        (b'{"model": "m", "messages": [{"role": "user", "content": 5}]}', 400, "messages"),
        (b'{"model": "m", "messages": [{"role": "user", "content": "q"}], "stream": "yes"}', 400, "stream"),
        (b'{"model": "m", "messages": [{"role": "user", "content": "q"}], "temperature": -1}', 400, "temperature"),
        (b'{"model": "m", "messages": [{"role": "user", "content": "q"}], "max_tokens": 0}', 400, "max_tokens"),
        (b'{"model": "m", "messages": [{"role": "user", "content": "q"}], "history": "x"}', 400, "history"),
        (b'{"model": "m", "messages": [{"role": "user", "content": "q"}], "stoker": {"dosc": []}}', 400, "stoker"),
        (b'{"model": "m", "messages": [{"role": "user", "content": "q"}], "stoker": {"docs": [{}]}}', 400, "stoker"),
    ],
)  # fmt: skip
def test_routes__bad_chat_bodies_are_400_with_the_field(
    gw: GatewayServer, body: bytes, status: int, param: str | None
) -> None:
    resp = httpx.post(
        gw.url + "/v1/chat/completions", content=body, headers={"x-stoker-tenant": "a"}
    )
    assert resp.status_code == status
    err = _error(resp)
    assert err["type"] == "invalid_request_error" and err["param"] == param


def test_routes__tenant_rules(gw: GatewayServer) -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": "q"}], "temperature": 0}
    url = gw.url + "/v1/chat/completions"
    missing = httpx.post(url, json=body)
    assert missing.status_code == 400 and "x-stoker-tenant" in _error(missing)["message"]
    braces = httpx.post(url, json=body, headers={"x-stoker-tenant": "a}b"})
    assert braces.status_code == 400 and _error(braces)["param"] == "x-stoker-tenant"
    forged = body | {"stoker": {"tenant": "globex"}}
    assert httpx.post(url, json=forged).status_code == 400  # the body may not name the tenant


def test_routes__body_over_the_limit_is_413(gw: GatewayServer) -> None:
    big = {"model": "m", "messages": [{"role": "user", "content": "x" * 70_000}]}
    resp = httpx.post(gw.url + "/v1/chat/completions", json=big, headers={"x-stoker-tenant": "a"})
    assert resp.status_code == 413 and _error(resp)["type"] == "invalid_request_error"


def test_routes__unknown_route_404_and_wrong_method_405(gw: GatewayServer) -> None:
    assert _error(httpx.get(gw.url + "/v1/nothing"))["type"] == "not_found_error"
    assert httpx.get(gw.url + "/v1/nothing").status_code == 404
    wrong = httpx.get(gw.url + "/v1/chat/completions")
    assert wrong.status_code == 405 and _error(wrong)["type"] == "invalid_request_error"


def test_routes__models_pass_through_health_ready_and_metrics(gw: GatewayServer) -> None:
    models = client(gw).models.list()
    assert [m.id for m in models.data] == ["sim-model"]
    assert httpx.get(gw.url + "/healthz").json() == {"status": "ok"}
    wait_for(lambda: gw.parts.health.state != "unknown", 10, "the first upstream check")
    ready = httpx.get(gw.url + "/readyz")
    assert ready.status_code == 200
    assert ready.json() == {
        "status": "ready", "redis": True, "upstream": "up", "upstream_url": gw.parts.upstream.shown,
        "upstream_detail": f"upstream {gw.parts.upstream.shown}: serves 1 model: sim-model",
    }  # fmt: skip
    text = httpx.get(gw.url + "/metrics").text
    assert "stoker_gateway_served_total" in text and "stoker_cache_lookups_total" in text


def test_routes__an_unreachable_upstream_is_502_and_openai_shaped(
    make_gateway: GatewayFactory,
) -> None:
    gw = make_gateway("http://127.0.0.1:1")
    with pytest.raises(openai.APIStatusError) as e:
        client(gw).chat.completions.create(
            model="m", messages=[{"role": "user", "content": "q"}], temperature=0
        )
    assert e.value.status_code == 502 and e.value.body["type"] == "upstream_error"
    # the body names the URL it could not reach, and why
    message = e.value.body["message"]
    assert "http://127.0.0.1:1/" in message and "ConnectError" in message, message


def _embedding_app() -> Any:
    """An OpenAI-compatible /v1/embeddings upstream that counts the texts it embeds."""
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    seen: list[str] = []

    async def embed(request: Request) -> JSONResponse:
        body = await request.json()
        texts = body["input"] if isinstance(body["input"], list) else [body["input"]]
        seen.extend(t for t in texts if isinstance(t, str))
        data = [{"object": "embedding", "index": i, "embedding": [float(len(str(t))), 1.0, 0.5]}
                for i, t in enumerate(texts)]  # fmt: skip
        return JSONResponse({"object": "list", "data": data, "model": body["model"],
                             "usage": {"prompt_tokens": 3 * len(texts), "total_tokens": 3}})  # fmt: skip

    app = Starlette(routes=[Route("/v1/embeddings", embed, methods=["POST"])])
    app.state.seen = seen
    return app


def test_routes__embeddings_go_through_the_embedding_cache(
    make_gateway: GatewayFactory, redis_client: redis.Redis
) -> None:
    app = _embedding_app()
    with Served(app) as up:
        gw = make_gateway(up.url)
        c = client(gw)
        first = c.embeddings.with_raw_response.create(model="e5", input=["alpha", "beta"])
        assert first.headers["x-stoker-cache"] == "miss:2"
        vecs = [d.embedding for d in first.parse().data]
        assert vecs == [[5.0, 1.0, 0.5], [4.0, 1.0, 0.5]]
        second = None
        for _ in range(50):  # the write-back is asynchronous: bounded retries until both hit
            second = c.embeddings.with_raw_response.create(model="e5", input=["beta", "gamma"])
            if second.headers["x-stoker-cache"] == "miss:1":
                break
        assert second is not None and second.headers["x-stoker-cache"] == "miss:1"
        assert [d.embedding for d in second.parse().data] == [[4.0, 1.0, 0.5], [5.0, 1.0, 0.5]]
        assert app.state.seen.count("beta") == 1
        b64 = c.embeddings.create(model="e5", input="alpha", encoding_format="base64")
        raw = b64.data[0].embedding
        decoded = np.frombuffer(base64.b64decode(raw), "<f4") if isinstance(raw, str) else raw
        assert list(decoded) == [5.0, 1.0, 0.5]
        other = client(gw, "globex").embeddings.with_raw_response.create(model="e5", input="alpha")
        assert other.headers["x-stoker-cache"] == "miss:1"  # tenants never share vectors


def test_routes__draining_answers_readyz_503_before_the_listener_closes(
    make_gateway: GatewayFactory, sim: SimulatorThread
) -> None:
    gw = make_gateway(sim.url, gateway_drain_notice_s=1.0)
    gw.stop()
    ready = httpx.get(gw.url + "/readyz")
    assert ready.status_code == 503 and ready.json()["status"] == "draining"
    assert client(gw).models.list().data  # still serving during the notice
    gw.join(15)

    def refused() -> bool:
        try:
            httpx.get(gw.url + "/healthz", timeout=1)
        except httpx.ConnectError:
            return True
        return False

    assert refused()
