"""Unicode edge cases through the key scheme (hypothesis, real Redis): any text is keyed into a
well-formed key of its own tenant, or refused with stoker's error; nothing foreign escapes.

A lone surrogate ("\\ud800") once raised UnicodeEncodeError from caches/keys.py and
caches/policy.py, so a gateway that catches StokerError crashed instead of serving upstream."""

from __future__ import annotations

from typing import Any

import httpx
import redis
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from caches.client import CacheClient
from caches.keys import entry_key_namespace, tenant_tag
from caches.request import CacheRequest, LookupResult, Probe
from schemas.common import DocRef, RequestParams, tenant_problem
from schemas.errors import RequestRejected

EDGES = [
    "\ud800", "a\udfffb", "\x00", "a\x00b", "\x1f", "\x7f", "{", "}", "{t:b}", "%", "%7B",
    ":", "*", "?", "[x]", "\\", "@", " ", "\t", "\n", "\u00a0", "\u200b", "\u202e", "\ufeff",
    "e\u0301", "\u00e9", "\ufb01", "\u0130", "\U0001f600", "\U0010ffff", "x" * 128, "x" * 129,
]  # fmt: skip
# every code point hypothesis can draw, surrogates included, plus the edges above
ANY_TEXT = st.text(st.characters(codec=None, exclude_categories=()), max_size=40)
TEXT = st.one_of(
    ANY_TEXT, st.sampled_from(EDGES), st.lists(st.sampled_from(EDGES), max_size=4).map("".join)
)
NON_EMPTY = TEXT.filter(bool)
FAST = settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


def _request(tenant: str, model: str, version: str, template: str, prompt: str,
             doc: str, extra: str) -> CacheRequest:  # fmt: skip
    return CacheRequest(
        tenant, model, version, template, prompt,
        RequestParams(max_tokens=8, **{"x_extra": extra}), (DocRef(doc_id=doc),),
    )  # fmt: skip


@FAST
@given(TEXT, NON_EMPTY, NON_EMPTY, NON_EMPTY, TEXT, NON_EMPTY, TEXT)
def test_key_scheme__any_text_is_keyed_or_refused_never_a_foreign_error(
    redis_client: redis.Redis,
    tenant: str, model: str, version: str, template: str, prompt: str, doc: str, extra: str,
) -> None:  # fmt: skip
    try:
        req = _request(tenant, model, version, template, prompt, doc, extra)
    except ValidationError:  # DocRef is pydantic: it refuses a surrogate, or 513 characters
        assume(False)
    client = CacheClient(redis_client)
    try:
        p = client.probe(req)
    except RequestRejected:
        return  # refused with stoker's error: what a gateway catches and serves upstream
    if isinstance(p, LookupResult):
        assert p.outcome == "bypass" and p.reason
        return
    assert isinstance(p, Probe) and tenant_problem(tenant) is None
    key = p.exact_key
    key.encode()  # a key is text Redis and JSON can carry
    assert key.startswith(tenant_tag(tenant) + ":")
    assert key.count("{") == 1 and key.count("}") == 1  # one hash tag: one slot, the tenant's
    assert entry_key_namespace(key) == (tenant, model, version, template)


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    st.lists(TEXT.filter(lambda t: tenant_problem(t) is None), min_size=2, max_size=2, unique=True),
    TEXT,
)
def test_key_scheme__distinct_tenants_never_share_an_entry(
    redis_client: redis.Redis, tenants: list[str], prompt: str
) -> None:
    """Stored under one tenant, an answer is a hit for it and never for another, however alike
    the two ids look (NFC vs NFD, a zero-width space, percent signs)."""
    client = CacheClient(redis_client)
    a, b = (CacheRequest(t, "m", "v1", "t1", prompt or "q") for t in tenants)
    try:
        miss = client.lookup(a, use_semantic=False)
    except RequestRejected:
        return  # the prompt cannot be keyed (a lone surrogate): refused for both
    if miss.outcome != "miss":
        assert miss.outcome in ("bypass", "exact")
        return
    assert client.store(miss, "the answer").landed
    assert client.lookup(a, use_semantic=False).outcome == "exact"
    assert client.lookup(b, use_semantic=False).outcome != "exact"
    redis_client.flushdb()


@FAST
@given(TEXT)
def test_store__an_answer_that_is_not_unicode_is_refused_with_a_reason(
    redis_client: redis.Redis, text: str
) -> None:
    client = CacheClient(redis_client)
    miss = client.lookup(CacheRequest("acme", "m", "v1", "t1", "a question"), use_semantic=False)
    if miss.outcome != "miss":
        redis_client.flushdb()
        miss = client.lookup(
            CacheRequest("acme", "m", "v1", "t1", "a question"), use_semantic=False
        )
    res = client.store(miss, "answer " + text)
    try:
        ("answer " + text).encode()
    except UnicodeEncodeError:
        assert not res.landed and res.reason == "response is not valid Unicode text"
        return
    assert res.landed, res.reason
    redis_client.flushdb()


def test_probe__empty_and_control_character_prompts_bypass(redis_client: redis.Redis) -> None:
    client = CacheClient(redis_client)
    for prompt, why in (("", "empty prompt"), ("   \n", "empty prompt"),
                        ("a\x00b", "prompt holds control characters"),
                        ("\x1b[31mred", "prompt holds control characters")):  # fmt: skip
        res = client.lookup(CacheRequest("acme", "m", "v1", "t1", prompt))
        assert (res.outcome, res.reason) == ("bypass", why)
        assert not client.store(res, "an answer").landed
    tabbed = client.lookup(CacheRequest("acme", "m", "v1", "t1", "line one\n\tline two\r\n"))
    assert tabbed.outcome == "miss"  # tab, newline and CR are text


def test_cache_request__the_events_tenant_rule(redis_client: redis.Redis) -> None:
    client = CacheClient(redis_client)
    for tenant in ("", " ", "a{b}", "x" * 129, "a\ud800"):
        try:
            client.lookup(CacheRequest(tenant, "m", "v1", "t1", "q"))
        except RequestRejected as e:
            assert "bad tenant" in str(e)
        else:
            raise AssertionError(f"tenant {tenant!r} was keyed")


def test_gateway__a_lone_surrogate_in_the_body_is_a_400_not_a_crash(
    make_gateway: Any, sim: Any
) -> None:
    """JSON may spell a lone surrogate ("\\ud800"); the gateway refuses that body as a bad
    request (orjson will not decode it), so no such text reaches a key or the request log."""
    gw = make_gateway(sim.url)
    body = (b'{"model": "m", "temperature": 0, "messages": '
            b'[{"role": "user", "content": "caf\\ud800"}]}')  # fmt: skip
    resp = httpx.post(gw.url + "/v1/chat/completions", content=body, timeout=30,
                      headers={"content-type": "application/json", "x-stoker-tenant": "acme"})  # fmt: skip
    assert resp.status_code == 400, resp.text
    assert resp.json()["error"]["type"] == "invalid_request_error"
