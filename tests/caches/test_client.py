"""The serving read/write path on the real redis-server, over each semantic store."""

from __future__ import annotations

import pytest

from caches import keys as K
from caches.client import CacheClient
from caches.request import CacheRequest
from schemas.common import DocRef, RequestParams

pytestmark = pytest.mark.topologies  # and standalone: see tests/conftest.py

D1 = DocRef(doc_id="kb/celsius", version=3)


def req(prompt: str = "How do I convert Celsius to Fahrenheit?", **kw) -> CacheRequest:
    fields = {
        "tenant": "acme",
        "model_id": "llama-3-8b",
        "model_version": "v1",
        "template_version": "t1",
        "docs": (D1,),
    } | kw
    return CacheRequest(prompt=prompt, **fields)


def warm(c: CacheClient, r: CacheRequest, answer: str = "multiply by 9/5, add 32") -> None:
    res = c.lookup(r)
    assert res.outcome == "miss"
    assert c.store(res, answer, gpu_ms=120, tokens_in=12, tokens_out=9).landed


def test_lookup__miss_then_exact_hit_with_provenance_and_ttl(cache_client: CacheClient):
    warm(cache_client, req())
    res = cache_client.lookup(req("  how do I convert CELSIUS to fahrenheit? "))
    assert res.outcome == "exact" and res.entry is not None
    p = res.entry.provenance
    assert (p.model_id, p.model_version, p.template_version, p.source) == (
        "llama-3-8b",
        "v1",
        "t1",
        "live",
    )
    assert p.cached_at >= p.generated_at
    assert res.entry.response == "multiply by 9/5, add 32" and res.entry.gpu_ms == 120
    key = req().key().exact()
    assert 0 < cache_client.redis.ttl(key) <= 600


def test_lookup__paraphrase_is_a_semantic_hit_with_score(cache_client: CacheClient):
    warm(cache_client, req())
    res = cache_client.lookup(req("how can I convert celsius into fahrenheit"))
    assert res.outcome == "semantic" and res.score is not None and res.score >= 0.92
    assert res.rule.startswith("cosine>=")
    assert res.entry is not None and res.entry.response == "multiply by 9/5, add 32"


@pytest.mark.parametrize(
    "change",
    [
        {"tenant": "globex"},
        {"model_version": "v2"},
        {"template_version": "t2"},
        {"model_id": "mistral"},
        {"docs": (DocRef(doc_id="kb/celsius", version=4),)},
        {"params": RequestParams(max_tokens=10)},
    ],
)
def test_lookup__nothing_crosses_tenant_version_template_context_or_params(cache_client, change):
    warm(cache_client, req())
    assert cache_client.lookup(req(**change)).outcome == "miss"
    assert (
        cache_client.lookup(req("how can I convert celsius into fahrenheit", **change)).outcome
        == "miss"
    )


@pytest.mark.parametrize(
    ("params", "reason"),
    [(RequestParams(temperature=0.7), "temperature>0"), (RequestParams(no_cache=True), "no-cache")],
)
def test_lookup__sampling_or_no_cache_is_never_cached(cache_client: CacheClient, params, reason):
    res = cache_client.lookup(req(params=params))
    assert res.outcome == "bypass" and res.reason == reason
    assert not cache_client.store(res, "an answer").landed
    assert cache_client.redis.keys("*:e:*") == []


@pytest.mark.parametrize(
    ("answer", "is_error", "why"),
    [
        ("", False, "empty"),
        ("   ", False, "empty"),
        ("boom", True, "error"),
        ("x" * 300_000, False, "over"),
    ],
)
def test_store__refuses_empty_error_and_oversized(cache_client: CacheClient, answer, is_error, why):
    res = cache_client.lookup(req())
    out = cache_client.store(res, answer, is_error=is_error)
    assert not out.landed and why in out.reason
    assert cache_client.lookup(req()).outcome == "miss"


@pytest.mark.parametrize("finish", ["length", "content_filter", "cancelled"])
def test_store__refuses_a_truncated_or_altered_answer(cache_client: CacheClient, finish: str):
    """A caller that passes the upstream's finish_reason never caches an answer cut at
    max_tokens; only "stop" and "tool_calls" are answers that ended on their own."""
    res = cache_client.lookup(req())
    out = cache_client.store(res, "the first half of an answer", finish_reason=finish)
    assert not out.landed and out.reason == f"incomplete answer (finish_reason {finish})"
    assert cache_client.lookup(req()).outcome == "miss"
    assert cache_client.store(res, "a whole answer", finish_reason="stop").landed


def test_lookup__an_answer_cut_at_max_tokens_makes_its_repeat_and_paraphrase_say_not_stored(
    cache_client: CacheClient,
):
    res = cache_client.lookup(req())
    assert res.reason == "semantic_none: no cached prompt is near this one"
    out = cache_client.store(res, "multiply by", finish_reason="length")
    assert not out.landed and out.unstored == "finish_reason=length"
    again = cache_client.lookup(req())
    assert again.outcome == "miss" and again.ticket is not None
    assert again.reason.startswith("not_stored: finish_reason=length: the last answer to this ")
    para = cache_client.lookup(req("how can I convert celsius into fahrenheit"))
    assert para.outcome == "miss"
    assert para.reason.startswith("not_stored: finish_reason=length: the last answer to a look")
    # another tenant never reads the mark; an unrelated prompt is not its look-alike
    assert cache_client.lookup(req(tenant="globex")).reason.startswith("semantic_none")
    assert cache_client.lookup(req("what is the capital of peru")).reason.startswith(
        "semantic_none"
    )
    # the answer in full, stored, serves the repeat and the paraphrase as before
    assert cache_client.store(again, "multiply by 9/5, add 32").landed
    assert cache_client.lookup(req()).outcome == "exact"
    assert cache_client.lookup(req("how can I convert celsius into fahrenheit")).hit


def test_lookup__a_prompt_over_the_cache_limit_bypasses_it(cache_client: CacheClient):
    """The limit is the cache's, not the model's: the request is answered, uncached."""
    res = cache_client.lookup(req("x" * 40_000))
    assert res.outcome == "bypass" and res.ticket is None
    assert res.reason.startswith("bypass: prompt over the cache's limit (40000 chars; ")


def test_store_negative__short_lived_negative_outcome(cache_client: CacheClient):
    res = cache_client.lookup(req())
    assert cache_client.store_negative(res)
    assert cache_client.lookup(req()).outcome == "negative"
    assert 0 < cache_client.redis.ttl(res.ticket.key.negative()) <= 5


def test_generation__write_begun_before_context_invalidation_does_not_land(
    cache_client: CacheClient,
):
    res = cache_client.lookup(req())  # computation begins
    cache_client.generations.bump_context("acme", res.ticket.key.context_hash)  # invalidation
    out = cache_client.store(res, "stale answer")  # computation ends
    assert not out.landed and "stale" in out.reason
    assert cache_client.lookup(req()).outcome == "miss"
    assert cache_client.lookup(req("how can I convert celsius into fahrenheit")).outcome == "miss"


def test_generation__write_on_an_outdated_doc_version_does_not_land(cache_client: CacheClient):
    res = cache_client.lookup(req())
    cache_client.generations.raise_doc_floor("acme", "kb/celsius", 4)
    assert not cache_client.store(res, "stale answer").landed
    fresh = req(docs=(DocRef(doc_id="kb/celsius", version=4),))
    warm(cache_client, fresh)  # the new version caches fine
    # a late, older event never lowers the floor
    assert cache_client.generations.raise_doc_floor("acme", "kb/celsius", 2) == 4


def test_generation__retired_model_version_takes_no_write(cache_client: CacheClient):
    before = cache_client.lookup(req())
    cache_client.generations.retire_model_version("llama-3-8b", "v1")
    assert not cache_client.store(before, "late answer").landed
    after = cache_client.lookup(req("a question asked after retirement"))
    assert after.ticket is not None and after.ticket.retired
    assert not cache_client.store(after, "answer").landed
    assert cache_client.redis.keys("*:e:*") == []
    warm(cache_client, req(model_version="v2"))  # the new version is untouched


def test_generation__retired_template_takes_no_write(cache_client: CacheClient):
    before = cache_client.lookup(req())
    cache_client.generations.retire_template("acme", "llama-3-8b", "t1")
    assert not cache_client.store(before, "late answer").landed
    warm(cache_client, req(template_version="t2"))


def test_generation__invalidation_after_landing_leaves_the_index_to_find_it(
    cache_client: CacheClient,
):
    warm(cache_client, req())
    idx = cache_client.redis.smembers(K.doc_index_key("acme", "kb/celsius"))
    key = req().key().exact().encode()
    assert idx == {key}
    assert 0 < cache_client.redis.ttl(K.doc_index_key("acme", "kb/celsius")) <= 600


def test_semantic__vector_whose_entry_is_gone_is_never_served(cache_client: CacheClient):
    warm(cache_client, req())
    cache_client.redis.delete(req().key().exact())
    assert cache_client.lookup(req("how can I convert celsius into fahrenheit")).outcome == "miss"


def test_semantic__per_tenant_threshold_applies(cache_client: CacheClient):
    warm(cache_client, req())
    paraphrase = req("how can I convert celsius into fahrenheit")
    assert cache_client.lookup(paraphrase, threshold=0.999).outcome == "miss"
    assert cache_client.lookup(paraphrase, threshold=0.5).outcome == "semantic"


def test_semantic__route_threshold_and_conservative_route_apply(redis_client, embedder, tmp_path):
    """A route's threshold overrides the tenant's; a conservative route takes no loose hit."""
    from caches.embedding_cache import CachedEmbedder
    from caches.policy import CachePolicy
    from caches.semantic.edge import EdgeSemanticStore

    store = EdgeSemanticStore(tmp_path / "edge", dim=embedder.dim)
    pol = CachePolicy(
        exact_ttl_s=600,
        threshold=0.5,
        route_thresholds={"acme/billing": 0.999},
        conservative_routes=frozenset({"*/legal"}),
        conservative_threshold=0.999,
    )
    c = CacheClient(
        redis_client,
        semantic=store,
        embedder=CachedEmbedder(embedder, redis_client, 600),
        policy=pol,
    )
    warm(c, req())
    paraphrase = "how can I convert celsius into fahrenheit"
    assert c.lookup(req(paraphrase)).outcome == "semantic"
    assert c.lookup(req(paraphrase, route="billing")).outcome == "miss"
    assert c.lookup(req(paraphrase, route="legal")).outcome == "miss"
    assert c.lookup(req(route="legal")).outcome == "exact"  # the route never splits exact keys
    store.close()
