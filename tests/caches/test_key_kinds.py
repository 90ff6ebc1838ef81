"""Every Redis key builder: keys of different kinds never coincide, whatever tenants, models,
templates, versions, doc ids and weeks they are built from, and a tenant's keys all carry its
Redis Cluster hash tag."""

from __future__ import annotations

from collections.abc import Callable
from datetime import date
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from redis.crc import key_slot

from caches import constants as C
from caches import keys as K
from caches.matching.counts import audited_key, budget_key
from schemas.common import DocRef

# Components a user controls are drawn from arbitrary text and from the fixed segments of the
# key layout itself (a model named "ns" made the prefix counts the profile's namespace set),
# alone or joined as a forger would join them.
SEGMENTS = [
    "e", "n", "u", "v", "g", "m", "t", "c", "d", "dg", "i", "b", "a", "ch", "dt", "cl", "cd", "p",
    "pc", "pm", "pi", "h", "s", "k", "r", "w", "ns", "wm", "tenants", "retired", "live", "stk",
    "{t:acme}", "{deploy}", "{prefixes}", "0", "1", "",
]  # fmt: skip
segment = st.sampled_from(SEGMENTS)
component = st.one_of(
    segment,
    st.lists(segment, min_size=2, max_size=4).map(":".join),
    st.text(max_size=12),
    st.text(alphabet=":{}@*%t", max_size=8),
    st.text(alphabet=st.characters(min_codepoint=0x80, exclude_categories=["Cs"]), max_size=6),
)
number = st.one_of(st.integers(-3, 200), st.integers())


def _same_or(strategy: st.SearchStrategy[Any], value: Any) -> st.SearchStrategy[Any]:
    return st.one_of(st.just(value), strategy)


FIELDS: dict[str, st.SearchStrategy[Any]] = {
    "tenant": component, "model": component, "version": component, "template": component,
    "doc": component, "embedder": component, "text": component, "digest": component,
    "route": component, "event": component, "week": number, "hour": number, "bucket": number,
    "day": st.dates(),
}  # fmt: skip


@st.composite
def two_drawings(draw: st.DrawFn) -> tuple[dict[str, Any], dict[str, Any]]:
    """Two sets of components; each field of the second is often the first's, so builders of
    different kinds meet the same tenant, model, ... as a real store does."""
    a = {f: draw(s) for f, s in FIELDS.items()}
    b = {f: draw(_same_or(s, a[f])) for f, s in FIELDS.items()}
    return a, b


def _ctx(c: dict[str, Any]) -> str:
    doc = DocRef(doc_id=c["doc"] or "-", version=1)  # a doc id is never empty
    return K.context_hash(c["model"], c["template"], (doc,))


def _ns(c: dict[str, Any]) -> K.Namespace:
    return K.Namespace(c["tenant"], c["model"], c["version"], c["template"])


def _entry(c: dict[str, Any]) -> K.CacheKey:
    return K.build_key(_ns(c), c["text"], {"temperature": 0})


Builder = Callable[[dict[str, Any]], str]
# kind -> builder; every key of a tenant, then the keys of no tenant.
TENANT_KEYS: dict[str, Builder] = {
    "exact": lambda c: _entry(c).exact(),
    "negative": lambda c: _entry(c).negative(),
    "unstored": lambda c: _entry(c).unstored(),
    "embedding": lambda c: K.embedding_key(c["tenant"], c["embedder"], c["text"]),
    "model generation": lambda c: K.model_gen_key(_ns(c)),
    "template generation": lambda c: K.template_gen_key(_ns(c)),
    "context generation": lambda c: K.context_gen_key(c["tenant"], _ctx(c)),
    "doc floor": lambda c: K.doc_floor_key(c["tenant"], c["doc"]),
    "doc generation": lambda c: K.doc_gen_key(c["tenant"], c["doc"]),
    "doc text": lambda c: K.doc_text_key(c["tenant"], c["doc"]),
    "doc index": lambda c: K.doc_index_key(c["tenant"], c["doc"]),
    "context index": lambda c: K.context_index_key(c["tenant"], _ctx(c)),
    "calibration note": lambda c: K.calibration_note_key(c["tenant"], c["digest"]),
    "calibration day": lambda c: K.calibration_day_key(c["tenant"], c["day"]),
    "changed": lambda c: K.changed_key(c["tenant"]),
    "budget": lambda c: budget_key(c["tenant"], c["route"], c["bucket"]),
    "audited": lambda c: audited_key(c["tenant"], c["event"]),
    "prefix counts": lambda c: K.prefix_counts_key(c["tenant"], c["model"]),
    "prefix meta": lambda c: K.prefix_meta_key(c["tenant"], c["model"]),
    "profile namespaces": lambda c: K.profile_namespaces_key(c["tenant"]),
    "profile watermarks": lambda c: K.profile_watermarks_key(c["tenant"]),
    "profile weeks": lambda c: K.profile_weeks_key(c["tenant"], c["model"], c["template"]),
    "profile hour": lambda c: K.profile_hour_key(
        c["tenant"], c["model"], c["template"], c["week"], c["hour"]
    ),
    **{
        f"profile week {part}": (
            lambda c, part=part: K.profile_week_key(
                c["tenant"], part, c["model"], c["template"], c["week"]
            )
        )
        for part in ("h", "s", "k", "r")
    },
}
GLOBAL_KEYS: dict[str, Builder] = {
    "tenant registry": lambda c: C.TENANT_REGISTRY,
    "profile tenants": lambda c: C.PROFILE_TENANTS,
    "retired marker": lambda c: K.retired_marker_key(c["model"], c["version"]),
    "live versions": lambda c: K.live_versions_key(c["model"]),
    "prefix index": lambda c: K.prefix_index_key(c["model"]),
    "scheduler lock": lambda c: K.SCHEDULER_LOCK_KEY,
    "load ratio": lambda c: K.LOAD_RATIO_KEY,
    "job record": lambda c: f"{K.JOB_RECORD_PREFIX}{c['route']}:{c['event']}",
    "recent jobs": lambda c: K.JOBS_RECENT_KEY,
    "deploy checkpoint": lambda c: f"{K.CHECKPOINT_PREFIX}{K.DEPLOY_TAG}:{c['event']}",
    "deploy queue": lambda c: K.DEPLOY_QUEUE_KEY,
    "deploy verdict": lambda c: K.DEPLOY_SUPERSEDE_PREFIX + c["event"],
    "deploy lease": lambda c: K.DEPLOY_LEASE_PREFIX + c["event"],
}
BUILDERS = {**TENANT_KEYS, **GLOBAL_KEYS}


@settings(max_examples=400)
@given(drawn=two_drawings())
def test_key_kinds__no_two_kinds_ever_build_the_same_key(drawn):
    seen: dict[str, str] = {}
    for c in drawn:
        for kind, build in BUILDERS.items():
            key = build(c)
            assert seen.setdefault(key, kind) == kind, f"{kind} and {seen[key]} share {key!r}"


def _hash_tag(key: str) -> str | None:
    """What Redis Cluster hashes: between the first "{" and the first "}" after it."""
    start = key.find("{")
    end = key.find("}", start + 1)
    return key[start + 1 : end] if start >= 0 and end > start + 1 else None


@given(c=st.fixed_dictionaries(FIELDS))
def test_key_kinds__a_tenants_keys_carry_its_hash_tag(c):
    tag = K.tenant_tag(c["tenant"])
    for kind, build in TENANT_KEYS.items():
        key = build(c)
        assert key.startswith(tag + ":"), kind
        assert _hash_tag(key) == f"t:{K.enc(c['tenant'])}", kind
        assert key_slot(key.encode()) == key_slot(tag.encode()), kind
        # the L1 tracks a tenant's exact entries by this prefix: nothing else may begin so
        assert key.startswith(K.exact_prefix(c["tenant"])) == (kind == "exact"), kind
    for kind, build in GLOBAL_KEYS.items():
        assert not build(c).startswith(K.TENANT_KEYS_PREFIX), kind  # no tenant pattern meets it


@given(a=component, b=component)
def test_key_kinds__tenants_never_share_a_key(a, b):
    c = {f: "x" for f in FIELDS} | {"week": 1, "hour": 2, "bucket": 3, "day": date(2025, 3, 3)}
    keys_a = {build(c | {"tenant": a}) for build in TENANT_KEYS.values()}
    keys_b = {build(c | {"tenant": b}) for build in TENANT_KEYS.values()}
    assert (keys_a & keys_b == set()) == (a != b)


def _fixed_segments(build: Builder) -> tuple[str, ...]:
    """The segments of a kind's keys that no component changes (after the tenant's tag)."""
    c1 = {f: "x" for f in FIELDS} | {"week": 1, "hour": 2, "bucket": 3, "day": date(2025, 3, 3)}
    c2 = {f: "y" for f in FIELDS} | {"week": 4, "hour": 5, "bucket": 6, "day": date(2025, 3, 4)}
    s1 = build(c1).removeprefix(K.tenant_tag("x") + ":").split(":")
    s2 = build(c2).removeprefix(K.tenant_tag("y") + ":").split(":")
    fixed = []
    for x, y in zip(s1, s2, strict=False):
        if x != y:
            break
        fixed.append(x)
    return tuple(fixed)


def test_key_kinds__no_kind_begins_another():
    """The layout rule behind the property above: a kind's fixed segments never begin another
    kind's, so keys of two kinds differ in a segment no component can change."""
    kinds = {kind: _fixed_segments(build) for kind, build in TENANT_KEYS.items()}
    for a, fa in kinds.items():
        for b, fb in kinds.items():
            if a != b:
                assert fa[: len(fb)] != fb, f"{b} {fb} begins {a} {fa}"
