"""The key scheme: normalisation, canonical params, context hash and every Redis key."""

from __future__ import annotations

import functools
import hashlib
import math
import re
import unicodedata
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import date
from typing import Any, Final, Literal
from urllib.parse import quote, unquote

import orjson

from caches import constants as C
from schemas.common import DocRef, RequestParams

_WS = re.compile(r"\s+")


def normalise_prompt(prompt: str) -> str:
    """NFKC, case-folded, whitespace collapsed and trimmed: what users mean as "the same text"."""
    if prompt.isascii():  # ASCII is NFKC-stable and casefolds like lower(): 3x faster hot path
        return " ".join(prompt.lower().split())
    return _WS.sub(" ", unicodedata.normalize("NFKC", prompt).casefold()).strip()


def _canon_value(v: Any) -> Any:
    if isinstance(v, bool) or v is None or isinstance(v, str):
        return v
    if isinstance(v, int):
        return v
    if isinstance(v, float):
        if not math.isfinite(v):
            return repr(v)
        r = round(v, C.PARAM_FLOAT_DECIMALS)
        return int(r) if r.is_integer() else r  # 100.0 and 100 key alike
    if isinstance(v, Mapping):
        return {str(k): _canon_value(v[k]) for k in sorted(v, key=str)}
    if isinstance(v, list | tuple):
        return [_canon_value(x) for x in v]
    return str(v)


_SCALARS = (str, int, bool, type(None))


def canonical_params(params: Mapping[str, Any]) -> str:
    """Sorted keys, floats rounded, ints and integral floats alike; a stable JSON string."""
    out: dict[str, Any] = {}
    for k, v in params.items():
        # scalars pass through untouched: the common request pays no recursion (hot path)
        out[str(k)] = v if type(v) in _SCALARS else _canon_value(v)
    return orjson.dumps(out, option=orjson.OPT_SORT_KEYS).decode()


def request_params_canon(params: RequestParams) -> str:
    """canonical_params(params.as_dict()), memoised for the common request without extras.

    Requests share few parameter sets, and the hit path pays for this on every lookup: ~0.4 us
    memoised against 2-5 us to rebuild and sort the JSON. The memo is keyed on every declared
    field's value (a field added to RequestParams keys it too); as_dict stays the one place
    that says which of them shape the answer."""
    if params.__pydantic_extra__:
        return canonical_params(params.as_dict())
    memo = tuple(params.__dict__.values())
    canon = _PARAMS_CANON.get(memo)
    if canon is None:
        if len(_PARAMS_CANON) >= _PARAMS_CANON_MAX:
            _PARAMS_CANON.clear()  # bounded; only costs recomputing
        canon = _PARAMS_CANON[memo] = canonical_params(params.as_dict())
    return canon


_PARAMS_CANON: dict[tuple[Any, ...], str] = {}
_PARAMS_CANON_MAX: Final = 4096


def context_hash(model_id: str, template_version: str, docs: Iterable[DocRef]) -> str:
    """hash(model id, template version, retrieved doc ids with their versions where known),
    order-free. A doc named by id alone (version None) keys as its id."""
    if docs == ():  # the common RAG-less request, then the one-doc one: no set, no sort
        pairs: tuple[tuple[str, int | None], ...] = ()
    elif isinstance(docs, tuple) and len(docs) == 1:
        pairs = ((docs[0].doc_id, docs[0].version),)
    else:
        pairs = tuple(sorted({(d.doc_id, d.version) for d in docs}, key=_doc_order))
    return _context_hash(model_id, template_version, pairs)


def _doc_order(pair: tuple[str, int | None]) -> tuple[str, int]:
    return pair[0], -1 if pair[1] is None else pair[1]


@functools.lru_cache(maxsize=65_536)  # most traffic shares few (model, template, docs) contexts
def _context_hash(
    model_id: str, template_version: str, pairs: tuple[tuple[str, int | None], ...]
) -> str:
    raw = orjson.dumps([model_id, template_version, pairs])
    return hashlib.sha256(raw).hexdigest()[: C.DIGEST_HEX]


@functools.lru_cache(maxsize=65_536)
def enc(component: str) -> str:
    """Percent-encode one key component; see constants.py for why."""
    return quote(component, safe="")


# Where every key of every tenant begins, and no other key does (the global ones below name
# their own slot, never "{t:"): the L1 tracks it, a purge of all tenants matches it.
TENANT_KEYS_PREFIX: Final = f"{C.KEY_ROOT}:{{t:"


@functools.lru_cache(maxsize=65_536)
def tenant_tag(tenant: str) -> str:
    return f"{TENANT_KEYS_PREFIX}{enc(tenant)}}}"


def exact_prefix(tenant: str) -> str:
    """Where every exact entry of the tenant begins (the L1 tracks only these)."""
    return f"{tenant_tag(tenant)}:{C.KIND_EXACT}:"


@functools.lru_cache(maxsize=65_536)
def _ns_path(model_id: str, model_version: str, template_version: str) -> str:
    return f"{enc(model_id)}@{enc(model_version)}:{enc(template_version)}"


@dataclass(frozen=True)
class Namespace:
    """Who and what an answer belongs to; every key and every vector filter carries all four."""

    tenant: str
    model_id: str
    model_version: str
    template_version: str

    @property
    def tag(self) -> str:
        return tenant_tag(self.tenant)

    @property
    def path(self) -> str:
        return _ns_path(self.model_id, self.model_version, self.template_version)

    @functools.cached_property  # a frozen dataclass keeps its __dict__: computed once per ns
    def exact_prefix(self) -> str:
        return f"{self.tag}:{C.KIND_EXACT}:{self.path}:"

    @functools.cached_property
    def negative_prefix(self) -> str:
        return f"{self.tag}:{C.KIND_NEGATIVE}:{self.path}:"

    @functools.cached_property
    def unstored_prefix(self) -> str:
        return f"{self.tag}:{C.KIND_UNSTORED}:{self.path}:"

    def entry_pattern(self, kind: str = C.KIND_EXACT) -> str:
        """SCAN MATCH pattern for every entry of this namespace (safe: components are encoded)."""
        return f"{self.tag}:{kind}:{self.path}:*"


def key_digest(prompt_norm: str, params_canon: str, ctx_hash: str) -> str:
    """The part of an entry key that names the request within its namespace."""
    raw = f"{prompt_norm}\x1f{params_canon}\x1f{ctx_hash}"  # = "\x1f".join(...), 0.3 us less
    return hashlib.sha256(raw.encode()).hexdigest()[: C.DIGEST_HEX]


@dataclass(frozen=True, slots=True)
class CacheKey:
    """One request's identity. Two requests share an exact entry iff their CacheKeys are equal."""

    ns: Namespace
    prompt_norm: str
    params_canon: str
    context_hash: str
    digest: str = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        digest = key_digest(self.prompt_norm, self.params_canon, self.context_hash)
        object.__setattr__(self, "digest", digest)  # computed once: every key below uses it

    @property
    def params_hash(self) -> str:
        return hashlib.sha256(self.params_canon.encode()).hexdigest()[:16]

    def exact(self) -> str:
        return self.ns.exact_prefix + self.digest

    def negative(self) -> str:
        return self.ns.negative_prefix + self.digest

    def unstored(self) -> str:
        return self.ns.unstored_prefix + self.digest


@functools.lru_cache(maxsize=4096)
def namespace(tenant: str, model_id: str, model_version: str, template_version: str) -> Namespace:
    """A shared Namespace per (tenant, model, version, template): few exist, and a shared one
    keeps its key prefixes computed, so a lookup does not rebuild them (~2 us)."""
    return Namespace(tenant, model_id, model_version, template_version)


def build_key(
    ns: Namespace, prompt: str, params: Mapping[str, Any], docs: Iterable[DocRef] = ()
) -> CacheKey:
    return CacheKey(
        ns=ns,
        prompt_norm=normalise_prompt(prompt),
        params_canon=canonical_params(params),
        context_hash=context_hash(ns.model_id, ns.template_version, docs),
    )


def embedding_key(tenant: str, embedder_id: str, text: str) -> str:
    digest = hashlib.sha256(text.encode()).hexdigest()
    return f"{tenant_tag(tenant)}:{C.KIND_EMBEDDING}:{enc(embedder_id)}:{digest}"


def model_gen_key(ns: Namespace) -> str:
    return f"{ns.tag}:{C.KIND_GEN_MODEL}:{enc(ns.model_id)}@{enc(ns.model_version)}"


def template_gen_key(ns: Namespace) -> str:
    return f"{ns.tag}:{C.KIND_GEN_TEMPLATE}:{enc(ns.model_id)}:{enc(ns.template_version)}"


def context_gen_key(tenant: str, ctx_hash: str) -> str:
    return f"{tenant_tag(tenant)}:{C.KIND_GEN_CONTEXT}:{ctx_hash}"


def doc_floor_key(tenant: str, doc_id: str) -> str:
    return f"{tenant_tag(tenant)}:{C.KIND_DOC_FLOOR}:{enc(doc_id)}"


def doc_gen_key(tenant: str, doc_id: str) -> str:
    return f"{tenant_tag(tenant)}:{C.KIND_DOC_GEN}:{enc(doc_id)}"


def doc_text_key(tenant: str, doc_id: str) -> str:
    return f"{tenant_tag(tenant)}:{C.KIND_DOC_TEXT}:{enc(doc_id)}"


def calibration_note_key(tenant: str, digest: str) -> str:
    return f"{tenant_tag(tenant)}:{C.KIND_CAL_NOTE}:{enc(digest)}"


def calibration_day_key(tenant: str, day: date) -> str:
    return f"{tenant_tag(tenant)}:{C.KIND_CAL_DAY}:{day.isoformat()}"


def changed_key(tenant: str) -> str:
    return f"{tenant_tag(tenant)}:{C.KIND_CHANGED}"


def retired_marker_key(model_id: str, model_version: str) -> str:
    """Global (not per tenant) marker of a retired model version (caches/generations.py)."""
    return f"{C.KEY_ROOT}:retired:{enc(model_id)}@{enc(model_version)}"


def live_versions_key(model_id: str) -> str:
    """The hash of a model's live versions the cutover publishes ("*" or a tenant -> JSON)."""
    return f"{C.LIVE_PREFIX}{enc(model_id)}"


def doc_index_key(tenant: str, doc_id: str) -> str:
    return f"{tenant_tag(tenant)}:{C.KIND_INDEX_DOC}:{enc(doc_id)}"


def context_index_key(tenant: str, ctx_hash: str) -> str:
    return f"{tenant_tag(tenant)}:{C.KIND_INDEX_CONTEXT}:{ctx_hash}"


def entries_pattern(
    model_id: str,
    model_version: str | None = None,
    *,
    tenant: str | None = None,
    template_version: str | None = None,
) -> str:
    """SCAN MATCH pattern for exact and negative entries of a model; None = any value there.

    Safe as a glob because every component is encoded: "*" in the tenant tag cannot run past
    the tag's "}" (the only one in a key), and "*" for a version cannot run past its ":".
    """
    tag = tenant_tag(tenant) if tenant is not None else f"{TENANT_KEYS_PREFIX}*}}"
    version = enc(model_version) if model_version is not None else "*"
    template = f"{enc(template_version)}:*" if template_version is not None else "*"
    return f"{tag}:[{C.KIND_EXACT}{C.KIND_NEGATIVE}]:{enc(model_id)}@{version}:{template}"


def entry_key_namespace(key: str) -> tuple[str, str, str, str] | None:
    """(tenant, model_id, model_version, template_version) of an entry key; None if not one."""
    head, sep, rest = key.partition("}:")
    prefix = TENANT_KEYS_PREFIX
    if not sep or not head.startswith(prefix):
        return None
    parts = rest.split(":")
    if len(parts) != 4 or parts[0] not in (C.KIND_EXACT, C.KIND_NEGATIVE) or "@" not in parts[1]:
        return None
    model, _, version = parts[1].partition("@")
    return unquote(head[len(prefix) :]), unquote(model), unquote(version), unquote(parts[2])


def prefix_counts_key(tenant: str, model_id: str) -> str:
    """The tenant's hot prompt prefixes of a model (zset digest -> count; warmers/prefix/hot.py)."""
    return f"{tenant_tag(tenant)}:{C.KIND_PREFIX_COUNTS}:{enc(model_id)}"


def prefix_meta_key(tenant: str, model_id: str) -> str:
    """The prefixes themselves (hash digest -> JSON), in the same slot as their counts."""
    return f"{tenant_tag(tenant)}:{C.KIND_PREFIX_META}:{enc(model_id)}"


def prefix_counts_key_before(tenant: str, model_id: str) -> str:
    """Where prefix counts were kept until they had a kind of their own (constants.py)."""
    return f"{tenant_tag(tenant)}:{C.KIND_PREFIX_COUNTS_BEFORE}:{enc(model_id)}"


def prefix_index_key(model_id: str) -> str:
    """The tenants with hot prefixes of a model (one set per model, its own slot)."""
    return f"{C.PREFIX_INDEX_PREFIX}{enc(model_id)}"


# -- the traffic profile (warmers/traffic/profile.py documents each part) --
# A week's parts: "n" hourly counts (one key per hour), "h" hourly totals, "s" summary,
# "k" costs, "r" representatives.
ProfileWeekPart = Literal["h", "s", "k", "r"]


@functools.lru_cache(maxsize=65_536)
def _profile_root(tenant: str) -> str:
    return f"{tenant_tag(tenant)}:{C.KIND_PROFILE}"


@functools.lru_cache(maxsize=65_536)  # the ingest path builds a few keys per namespace a batch
def _profile_ns(model_id: str, template_version: str) -> str:
    return f"{enc(model_id)}:{enc(template_version)}"


def profile_namespaces_key(tenant: str) -> str:
    """Set of "<model>\\x1f<template>" the tenant's profile has seen."""
    return f"{_profile_root(tenant)}:ns"


def profile_watermarks_key(tenant: str) -> str:
    """Hash "<topic>:<partition>" -> the last offset applied to the tenant's profile."""
    return f"{_profile_root(tenant)}:wm"


def profile_weeks_key(tenant: str, model_id: str, template_version: str) -> str:
    """Zset of the weeks with data (member = score = week number)."""
    return f"{_profile_root(tenant)}:w:{_profile_ns(model_id, template_version)}"


def profile_week_key(
    tenant: str, part: ProfileWeekPart, model_id: str, template_version: str, week: int
) -> str:
    return f"{_profile_root(tenant)}:{part}:{_profile_ns(model_id, template_version)}:{int(week)}"


def profile_hour_key(
    tenant: str, model_id: str, template_version: str, week: int, hour_of_week: int
) -> str:
    """Hash query key -> warmable requests in one hour of one week."""
    ns = _profile_ns(model_id, template_version)
    return f"{_profile_root(tenant)}:n:{ns}:{int(week)}:{int(hour_of_week)}"


# -- keys of no tenant: each names a slot of its own, and none begins TENANT_KEYS_PREFIX, so no
# purge or invalidation pattern can match (and so delete) one --
# The warm scheduler's leader lease (warmers/scheduler.py).
SCHEDULER_LOCK_KEY: Final = f"{C.KEY_ROOT}:scheduler:leader"
# How the load the warm backend served ran against the forecast, as the scheduler last read it
# (warmers/headroom.py: SharedRatio), for the deploy worker's pre-warm.
LOAD_RATIO_KEY: Final = f"{C.KEY_ROOT}:scheduler:load_ratio"
# Job records (streams/jobs.py) share one hash tag: a record and the index land in one round
# trip on a Redis Cluster too.
JOBS_TAG: Final = "{jobs}"
JOB_RECORD_PREFIX: Final = f"{C.KEY_ROOT}:jobs:{JOBS_TAG}:rec:"
JOBS_RECENT_KEY: Final = f"{C.KEY_ROOT}:jobs:{JOBS_TAG}:recent"
# Checkpoints of purges and cutovers (invalidators/checkpoint.py).
CHECKPOINT_PREFIX: Final = f"{C.KEY_ROOT}:job:"
# Deploy cutover jobs: the job document (a checkpoint), the due queue, a newer deploy's verdict
# and the runner's lease share one hash tag, so accepting a job is one atomic script on a Redis
# Cluster too (invalidators/checkpoint.py says what each holds).
DEPLOY_TAG: Final = "{deploy}"
DEPLOY_QUEUE_KEY: Final = f"{C.KEY_ROOT}:jobq:{DEPLOY_TAG}"
DEPLOY_SUPERSEDE_PREFIX: Final = f"{C.KEY_ROOT}:jobsup:{DEPLOY_TAG}:"
DEPLOY_LEASE_PREFIX: Final = f"{C.KEY_ROOT}:lease:{DEPLOY_TAG}:"
