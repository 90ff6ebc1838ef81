"""The cache identity of an HTTP request: who asks, in which namespace, what, with which context.

From a POST /v1/chat/completions or /v1/completions body and its headers (the README's "Cache
identity" section says the same for users):
- tenant: with an API-key map, the tenant of the bearer key (unknown or missing: 401, and the
  header is ignored); else X-Stoker-Tenant; else `stoker.tenant` if the operator allows it;
  else the default tenant; else 400;
- model id: the body's "model"; model version: X-Stoker-Model-Version, else the live version
  the deploy cutover published (resolved by the caller, see cachegate.py), else the default;
- template version: X-Stoker-Template-Version, else a digest of the system message(s);
- question: the last message's text (a completion's prompt); earlier turns key the answer as
  RequestParams.history (a digest), so an answer is never served after another conversation;
- params: every other body field (tools, response_format, max_tokens, ...), plus which API;
- docs and route: the `stoker` extension object, removed before the request goes upstream.
Some requests are answered but never cached (`bypass`): sampling (temperature > 0; none given
means the upstream's default, `default_temperature`, and a bypass of its own reason,
temperature_unset, that says what to send), n > 1, logprobs, non-text content, an empty question.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import orjson
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from caches.request import CacheRequest
from gateway.errors import BadRequest, PayloadTooLarge, Unauthorized
from gateway.options import GatewayOptions
from schemas.codec import NotJsonObject, json_object
from schemas.common import DocRef, RequestParams, Tenant, tenant_problem

Api = Literal["chat", "completion"]

TENANT_HEADER = "x-stoker-tenant"
TEMPLATE_HEADER = "x-stoker-template-version"
VERSION_HEADER = "x-stoker-model-version"
EXTENSION = "stoker"
# Body fields that never change the answer, so they do not key it.
_NOT_KEYED = frozenset(
    {"model", "messages", "prompt", "stream", "stream_options", "user", "metadata", "store",
     "service_tier", EXTENSION}
)  # fmt: skip
_SYSTEM_ROLES = frozenset({"system", "developer"})
_RESERVED = ("api", "history")  # RequestParams fields the gateway sets itself
_DIGEST_HEX = 32
# The template version of a request that sends no system message and no template header.
NO_SYSTEM_TEMPLATE = "sys-none"


class Extension(BaseModel):
    """The `stoker` object of a request body; unknown keys are a 400 (a typo would silently
    not scope the cache)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    docs: tuple[DocRef, ...] = ()
    route: str | None = Field(default=None, min_length=1, max_length=256)
    tenant: Tenant | None = None


@dataclass(frozen=True)
class Resolved:
    """What the gateway knows of a request before the cache is asked."""

    api: Api
    body: dict[str, Any]  # what goes upstream: the stoker extension removed
    stream: bool
    include_usage: bool
    tenant: str
    model_id: str
    template_version: str
    question: str
    params: RequestParams
    docs: tuple[DocRef, ...]
    route: str
    version_override: str | None  # X-Stoker-Model-Version
    read: bool = True  # Cache-Control: no-cache -> False
    write: bool = True  # Cache-Control: no-store -> False
    bypass: str | None = None  # why the cache is not used for this request at all
    upstream_body: bytes = field(default=b"", repr=False)

    def cache_request(self, model_version: str) -> CacheRequest:
        return CacheRequest(
            self.tenant, self.model_id, model_version, self.template_version, self.question,
            self.params, self.docs, self.route,
        )  # fmt: skip


def parse_body(raw: bytes, limit: int) -> dict[str, Any]:
    if len(raw) > limit:
        raise PayloadTooLarge(f"request body of {len(raw)} bytes is over the limit of {limit}")
    try:
        return json_object(raw)
    except NotJsonObject as e:
        raise BadRequest(f"the request body {e}") from None


def resolve(
    api: Api, body: dict[str, Any], headers: Mapping[str, str], path: str, opts: GatewayOptions
) -> Resolved:
    """The request's identity; raises BadRequest / Unauthorized with what is wrong."""
    ext = _extension(body.get(EXTENSION))
    upstream = {k: v for k, v in body.items() if k != EXTENSION}
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise BadRequest("model must be a non-empty string", param="model")
    stream = body.get("stream") or False
    if not isinstance(stream, bool):
        raise BadRequest("stream must be true or false", param="stream")
    question, history, systems, why = (
        _chat_turns(body.get("messages")) if api == "chat" else _completion_prompt(body)
    )
    params, bypass = _params(api, body, history, opts)
    directives = _cache_control(headers.get("cache-control", ""))
    return Resolved(
        api=api,
        body=upstream,
        stream=stream,
        include_usage=_include_usage(body.get("stream_options")),
        tenant=_tenant(headers, ext, opts),
        model_id=model,
        template_version=headers.get(TEMPLATE_HEADER) or _template_digest(systems),
        question=question,
        params=params,
        docs=ext.docs,
        route=ext.route or path,
        version_override=headers.get(VERSION_HEADER) or None,
        read="no-cache" not in directives,
        write="no-store" not in directives,
        bypass=why or bypass or ("empty prompt" if not question.strip() else None),
        upstream_body=orjson.dumps(upstream),
    )


def resolve_tenant(headers: Mapping[str, str], body: dict[str, Any], opts: GatewayOptions) -> str:
    """The tenant alone (the embeddings route); removes the stoker extension from body."""
    return _tenant(headers, _extension(body.pop(EXTENSION, None)), opts)


def _extension(raw: Any) -> Extension:
    if raw is None:
        return Extension()
    try:
        return Extension.model_validate(raw)
    except ValidationError as e:
        errors = "; ".join(
            f"{'.'.join(map(str, err['loc'])) or EXTENSION}: {err['msg']}"
            for err in e.errors(include_url=False)[:5]
        )
        raise BadRequest(f"bad stoker extension: {errors}", param=EXTENSION) from None


def _tenant(headers: Mapping[str, str], ext: Extension, opts: GatewayOptions) -> str:
    if opts.api_key_tenants:
        auth = headers.get("authorization", "")
        key = auth[7:].strip() if auth[:7].lower() == "bearer " else ""
        tenant = opts.api_key_tenants.get(hashlib.sha256(key.encode()).hexdigest()) if key else None
        if tenant is None:
            raise Unauthorized("unknown or missing API key", code="invalid_api_key")
        return tenant
    tenant = headers.get(TENANT_HEADER) or (ext.tenant if opts.tenant_from_body else None)
    tenant = tenant or opts.default_tenant
    if tenant is None:
        raise BadRequest(
            f"no tenant: send the {TENANT_HEADER} header (each tenant's answers are cached apart), "
            "or set STOKER_GATEWAY_DEFAULT_TENANT for requests that carry none",
            param=TENANT_HEADER,
        )
    return _valid_tenant(tenant)


def _valid_tenant(tenant: str) -> str:
    """The events' tenant rule (schemas.common.tenant_problem), so every tenant the gateway
    serves is one its request log can name."""
    problem = tenant_problem(tenant)
    if problem is not None:
        raise BadRequest(f"bad tenant {tenant[:40]!r}: {problem}", param=TENANT_HEADER)
    return tenant


def _text(content: Any) -> str | None:
    """A message's text, or None when it holds anything but text parts (images, audio)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for p in content:
            if (
                not isinstance(p, dict)
                or p.get("type") != "text"
                or not isinstance(p.get("text"), str)
            ):
                return None
            parts.append(p["text"])
        return "\n".join(parts)
    raise BadRequest("message content must be a string or a list of parts", param="messages")


def _chat_turns(messages: Any) -> tuple[str, str | None, list[str], str | None]:
    """(question, digest of the earlier turns or None, system texts, bypass reason)."""
    if not isinstance(messages, list) or not messages:
        raise BadRequest("messages must be a non-empty list", param="messages")
    systems: list[str] = []
    turns: list[list[Any]] = []
    why = None
    for m in messages:
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise BadRequest("every message needs a role", param="messages")
        text = _text(m.get("content"))
        if text is None:
            why, text = "non-text content", ""
        if m["role"] in _SYSTEM_ROLES:
            systems.append(text)
            continue
        turns.append([m["role"], text, m.get("name"), m.get("tool_calls"), m.get("tool_call_id")])
    if not turns:
        raise BadRequest(
            "messages need at least one that is not a system message", param="messages"
        )
    last = turns[-1]
    earlier = turns[:-1] if last[0] == "user" else turns
    history = _digest(earlier) if earlier else None
    return str(last[1]), history, systems, why


def _completion_prompt(body: dict[str, Any]) -> tuple[str, str | None, list[str], str | None]:
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if isinstance(prompt, list):
        return "", None, [], "several prompts"
    if not isinstance(prompt, str):
        raise BadRequest("prompt must be a string", param="prompt")
    return prompt, None, [], None


def _params(
    api: Api, body: dict[str, Any], history: str | None, opts: GatewayOptions
) -> tuple[RequestParams, str | None]:
    reserved = [k for k in _RESERVED if k in body]
    if reserved:
        raise BadRequest(f"{', '.join(reserved)} is not an OpenAI parameter", param=reserved[0])
    # null is the API's "use the default": it keys as if absent
    fields = {k: v for k, v in body.items() if k not in _NOT_KEYED and v is not None}
    unset = "temperature" not in fields
    fields.setdefault("temperature", opts.default_temperature)
    try:
        params = RequestParams(**fields, api=api, history=history)
    except ValidationError as e:
        err = e.errors(include_url=False)[0]
        name = ".".join(map(str, err["loc"]))
        raise BadRequest(f"{name}: {err['msg']}", param=name) from None
    why = _uncacheable(fields)
    if why is None and unset and opts.default_temperature > 0:
        why = _temperature_unset(opts.default_temperature)
    return params, why


def _temperature_unset(default: float) -> str:
    """Not temperature>0: the client chose nothing, so it may not know it must (the reason is
    the X-Stoker-Reason header: it says what to set)."""
    return (
        f"temperature_unset: no temperature sent, taken as {default:g} (sampling), so not "
        "cached; send temperature=0, or set STOKER_GATEWAY_DEFAULT_TEMPERATURE=0 where the "
        "upstream decodes greedily"
    )


def _uncacheable(fields: dict[str, Any]) -> str | None:
    """Answers a cache cannot give back as asked: several choices, or token log-probs."""
    if fields.get("n") not in (None, 1):
        return "n>1"
    if fields.get("logprobs") or fields.get("top_logprobs") or fields.get("echo"):
        return "logprobs"
    return None


def _include_usage(opts: Any) -> bool:
    return isinstance(opts, dict) and opts.get("include_usage") is True


def _cache_control(value: str) -> set[str]:
    return {d.strip().lower() for d in value.split(",") if d.strip()}


def _template_digest(systems: list[str]) -> str:
    """A template version for clients that send none: the system prompt's digest. When the
    system message inlines retrieved documents, send X-Stoker-Template-Version instead: else
    every edit of a document is a new template (safe, but answers are never reused)."""
    return f"sys-{_digest(systems)[:16]}" if systems else NO_SYSTEM_TEMPLATE


def _digest(obj: Any) -> str:
    raw = orjson.dumps(obj, option=orjson.OPT_SORT_KEYS)
    return hashlib.sha256(raw).hexdigest()[:_DIGEST_HEX]
