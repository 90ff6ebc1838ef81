"""Properties of the key scheme: nothing crosses tenants, versions or templates; keys are stable."""

from __future__ import annotations

import hashlib
import itertools

import pytest
import redis
from hypothesis import given
from hypothesis import strategies as st

from caches import constants as C
from caches import keys as K
from caches.request import CacheRequest
from schemas.common import DocRef, RequestParams

text = st.text(min_size=1, max_size=24)
namespaces = st.builds(K.Namespace, text, text, text, text)
params = st.dictionaries(
    st.sampled_from(["temperature", "max_tokens", "top_p", "stop", "seed"]),
    st.one_of(
        st.integers(-5, 5000), st.floats(0, 2, allow_nan=False), st.text(max_size=4), st.booleans()
    ),
)
docs = st.lists(st.builds(DocRef, doc_id=text, version=st.integers(0, 50)), max_size=4)


@given(a=namespaces, b=namespaces, prompt=st.text(max_size=40), p=params, d=docs)
def test_keys__never_shared_across_namespaces(a, b, prompt, p, d):
    ka, kb = K.build_key(a, prompt, p, d), K.build_key(b, prompt, p, d)
    if a != b:
        assert ka.exact() != kb.exact()
        assert ka.negative() != kb.negative()
    if a.tenant != b.tenant:
        assert a.tag != b.tag  # a different tenant never even shares a hash slot tag


@given(ns=namespaces, prompt=st.text(max_size=40), p=params)
def test_keys__every_key_names_tenant_model_version_and_template(ns, prompt, p):
    key = K.build_key(ns, prompt, p).exact()
    assert key.startswith(f"stk:{{t:{K.enc(ns.tenant)}}}:e:")
    assert f"{K.enc(ns.model_id)}@{K.enc(ns.model_version)}:{K.enc(ns.template_version)}:" in key


@given(s=st.text(max_size=40))
def test_enc__leaves_no_separator_or_glob_character(s):
    assert not set(K.enc(s)) & set(":@{}*?[]\\ ")


@given(s=st.text(max_size=60))
def test_normalise_prompt__is_idempotent(s):
    n = K.normalise_prompt(s)
    assert K.normalise_prompt(n) == n


@given(words=st.lists(st.text(alphabet="abcXYZ", min_size=1, max_size=5), min_size=1, max_size=6))
def test_normalise_prompt__ignores_case_and_whitespace(words):
    a = " ".join(words)
    b = "  " + "\t\n ".join(w.upper() for w in words) + "  "
    assert K.normalise_prompt(a) == K.normalise_prompt(b)


def test_normalise_prompt__folds_compatibility_forms():
    assert K.normalise_prompt("Ｃａｆé\u00a0ﬁle") == K.normalise_prompt("café file")


@given(p=params)
def test_canonical_params__independent_of_order(p):
    reordered = dict(reversed(list(p.items())))
    assert K.canonical_params(p) == K.canonical_params(reordered)


@given(x=st.floats(0, 2, allow_nan=False))
def test_canonical_params__rounds_floats(x):
    assert K.canonical_params({"temperature": x}) == K.canonical_params({"temperature": x + 1e-9})


def test_canonical_params__integral_float_equals_int_but_close_values_differ():
    assert K.canonical_params({"max_tokens": 100.0}) == K.canonical_params({"max_tokens": 100})
    assert K.canonical_params({"top_p": 0.1}) != K.canonical_params({"top_p": 0.11})


@given(d=docs)
def test_context_hash__order_free_and_version_sensitive(d):
    h = K.context_hash("m", "t", d)
    assert h == K.context_hash("m", "t", list(reversed(d)))
    if d:
        bumped = [DocRef(doc_id=d[0].doc_id, version=d[0].version + 1000), *d[1:]]
        assert K.context_hash("m", "t", bumped) != h
    assert K.context_hash("m2", "t", d) != h
    assert K.context_hash("m", "t2", d) != h


NASTY = ["v*", "v?", "v[1]", "v:1", "v@1", "{v}", "v\\1", "v%2A", "v 1"]


@pytest.mark.parametrize("version", NASTY)
def test_entry_pattern__scan_matches_exactly_one_namespace(redis_client: redis.Redis, version):
    """SCAN MATCH with a version full of glob and separator characters finds only its keys."""
    mine = K.Namespace("acme", "m", version, "t")
    others = [K.Namespace("acme", "m", v, "t") for v in NASTY if v != version]
    others.append(K.Namespace("acme2", "m", version, "t"))
    for i, ns in itertools.product(range(3), [mine, *others]):
        redis_client.set(K.build_key(ns, f"p{i}", {}).exact(), b"x")
    found = set(redis_client.scan_iter(match=mine.entry_pattern(), count=1000))
    want = {K.build_key(mine, f"p{i}", {}).exact().encode() for i in range(3)}
    assert found == want


temperatures = st.floats(0, 2, allow_nan=False) | st.integers(0, 2)
request_params = st.builds(
    RequestParams,
    temperature=temperatures,
    max_tokens=st.none() | st.integers(1, 5000),
    top_p=st.none() | st.floats(0, 1, allow_nan=False),
) | st.builds(lambda t, stop: RequestParams(temperature=t, stop=stop), temperatures, text)


@given(ns=namespaces, prompt=st.text(max_size=40), p=request_params, d=docs)
def test_cache_request_key__same_key_as_build_key(ns, prompt, p, d):
    # The lookup's memoised path must key exactly like the reference build_key: a drift
    # would turn every existing entry into a miss (or, worse, merge two requests).
    req = CacheRequest(*astuple_ns(ns), prompt, params=p, docs=tuple(d))
    ref = K.build_key(ns, prompt, p.as_dict(), d)
    assert req.key() == ref
    assert req.key().exact() == ref.exact() and req.key().negative() == ref.negative()
    assert K.request_params_canon(p) == K.canonical_params(p.as_dict())


def astuple_ns(ns: K.Namespace) -> tuple[str, str, str, str]:
    return ns.tenant, ns.model_id, ns.model_version, ns.template_version


@given(d=docs)
def test_context_hash__tuple_fast_path_matches_any_iterable(d):
    assert K.context_hash("m", "t", tuple(d)) == K.context_hash("m", "t", list(d))
    assert K.context_hash("m", "t", tuple(d)) == K.context_hash("m", "t", iter(d[::-1]))


@given(p=st.text(max_size=30), c=st.text(max_size=30), h=st.text(max_size=30))
def test_key_digest__keeps_the_documented_layout(p, c, h):
    # Entries already in Redis stay reachable only while the digest's input layout holds:
    # sha256 of the three parts joined by the unit separator, cut to DIGEST_HEX hex digits.
    raw = "\x1f".join((p, c, h)).encode()
    want = hashlib.sha256(raw).hexdigest()[: C.DIGEST_HEX]
    assert K.key_digest(p, c, h) == want
