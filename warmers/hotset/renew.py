"""Documents' texts after a KB change, and what they replaced: how a logged request is renewed.

A request log (v2) holds each request as it was sent upstream, retrieved documents inlined. When
a document changes, the entries built on it are deleted (invalidators/invalidation.py), and the
logged bodies still inline its old text: replayed as they are, they would warm the old answer.
A KB change event of schema v2 carries the new text and, when its producer has it, the old one
(a CDC tool's after and before images). `note` keeps them per tenant and document; `renew`
substitutes the newest text for any older one it finds in a logged body, so a warm computes the
answer the next live request, which inlines the new text, will ask for.

One key per document, in its tenant's slot (caches/keys.doc_text_key): JSON
{"version": the doc version the text is, "text": it, "old": the texts it replaced, newest first,
at most `KEEP_OLD`}. A replayed older event never moves it back; the key lives `ttl_s` after
the document's last change (by default as long as a logged request is replayed).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import orjson
import redis

from caches import keys as K
from caches import slots
from caches.boundary import as_bytes, redis_boundary
from schemas.common import DocRef
from warmers.hotset.plan import PlanItem
from warmers.prefix.hot import PREFIX_ROLES

# Texts a document's old versions had: a body logged three changes ago still renews.
KEEP_OLD = 4
DOC_TEXT_TTL_S = 14 * 86_400

# KEYS[1] = the doc's key; ARGV = version, text, previous text ("" = not given), keep, ttl.
# A newer version moves the text into "old"; the same version only adds a before image it did
# not have; an older one changes nothing. cjson encodes an empty list as {}: `read` takes that
# as no old text.
_NOTE_LUA = """
local v = tonumber(ARGV[1])
local cur = redis.call('GET', KEYS[1])
local doc = {version = -1, text = '', old = {}}
if cur then doc = cjson.decode(cur) end
if v < doc.version then return 0 end
local old = {}
local function add(t)
  if t == '' or t == ARGV[2] then return end
  for _, o in ipairs(old) do if o == t then return end end
  if #old < tonumber(ARGV[4]) then old[#old + 1] = t end
end
if v > doc.version then
  add(ARGV[3])
  add(doc.text)
  for _, o in ipairs(doc.old or {}) do add(o) end
else
  for _, o in ipairs(doc.old or {}) do add(o) end
  add(ARGV[3])
end
redis.call('SET', KEYS[1], cjson.encode({version = v, text = ARGV[2], old = old}), 'EX', ARGV[5])
return 1
"""


@dataclass(frozen=True)
class DocText:
    """A document's text at `version`, and the older texts it replaced (newest first)."""

    version: int
    text: str
    old: tuple[str, ...]


class DocTexts:
    def __init__(self, r: redis.Redis, *, ttl_s: int = DOC_TEXT_TTL_S) -> None:
        self.r = r
        self.ttl_s = ttl_s
        self._note = r.register_script(_NOTE_LUA)

    def note(self, tenant: str, doc_id: str, version: int, text: str, previous: str | None) -> bool:
        """Keep `text` as the document's at `version` (and `previous` as a text it replaced);
        False if a newer version is kept already."""
        with redis_boundary("note doc text"):
            done = self._note(
                keys=[K.doc_text_key(tenant, doc_id)],
                args=[version, text, previous or "", KEEP_OLD, self.ttl_s],
            )
        return bool(done)

    def read(self, docs: Iterable[tuple[str, str]]) -> dict[tuple[str, str], DocText]:
        """The kept text of each (tenant, doc id) that has one."""
        names = sorted(set(docs))
        with redis_boundary("read doc texts"):
            got = slots.mget(self.r, [K.doc_text_key(t, d) for t, d in names])
        out = {}
        for name, raw in zip(names, got, strict=True):
            if raw is not None:
                obj = orjson.loads(as_bytes(raw))
                out[name] = DocText(int(obj["version"]), obj["text"], tuple(obj["old"] or ()))
        return out


def renew(
    body: Mapping[str, Any], olds: Sequence[str], new: str
) -> tuple[dict[str, Any], Callable[[str], str]] | None:
    """The logged body with every one of `olds` found in its messages (or prompt) replaced by
    `new`, in one pass, and that substitution (for the question the body's key was built on);
    None when the body holds none of them (the document reached the model in another form:
    chunked, quoted, reformatted), which no substitution can fix."""
    sent = {k: body[k] for k in ("messages", "prompt") if k in body}
    found = [o for o in olds if o and _holds(sent, o)]
    if not found:
        return None
    # Longest first: an old text that contains another is replaced whole.
    pattern = re.compile("|".join(re.escape(o) for o in sorted(found, key=len, reverse=True)))

    def sub(text: str) -> str:
        return pattern.sub(lambda _m: new, text)

    return dict(body) | {k: _replace(v, sub) for k, v in sent.items()}, sub


def _holds(value: Any, text: str) -> bool:
    if isinstance(value, str):
        return text in value
    if isinstance(value, list):
        return any(_holds(v, text) for v in value)
    if isinstance(value, dict):
        return any(_holds(v, text) for v in value.values())
    return False


def _replace(value: Any, sub: Callable[[str], str]) -> Any:
    if isinstance(value, str):
        return sub(value)
    if isinstance(value, list):
        return [_replace(v, sub) for v in value]
    if isinstance(value, dict):
        return {k: _replace(v, sub) for k, v in value.items()}
    return value


# -- a plan's items whose documents changed since they were logged (HotSetSelector) --


def changed_docs(
    i: PlanItem, gens: Mapping[tuple[str, str], int], floors: Mapping[tuple[str, str], int]
) -> tuple[str, ...]:
    """The docs of a logged request that changed since it was logged: named by id alone, its
    doc generation moved; versioned, its floor rose above the version."""
    r = i.item.request
    if r.body is None:
        return ()
    logged = r.doc_generations or {}
    return tuple(
        d.doc_id for d in r.docs
        if (d.version is None and gens[(i.tenant, d.doc_id)] != logged.get(d.doc_id, 0))
        or (d.version is not None and floors[(i.tenant, d.doc_id)] > d.version)
    )  # fmt: skip


def renewed_item(
    i: PlanItem,
    docs: Sequence[str],
    texts: Mapping[tuple[str, str], DocText],
    gens: Mapping[tuple[str, str], int],
    floors: Mapping[tuple[str, str], int],
) -> tuple[PlanItem | None, str]:
    """The item with each changed doc's new text in its logged request, its version and
    generation now; or None and why not."""
    req, ident = i.item.request, i.item.identity
    assert req.body is not None  # changed_docs names docs of logged bodies only
    body, prompt, query, refs = dict(req.body), req.prompt, ident.prompt, list(req.docs)
    gen_of = dict(req.doc_generations or {})
    for doc in docs:
        t = texts.get((i.tenant, doc))
        floor = floors[(i.tenant, doc)]
        why = f"its document {doc} changed since it was logged"
        if t is None:
            return None, f"{why}, and its new text is not known (a KB change v2 carries it)"
        if t.version != floor:
            return None, f"{why}; the text known is of version {t.version}, the doc is at {floor}"
        got = renew(body, t.old, t.text)
        if got is None:
            return None, f"{why}, and the logged request holds none of its known old texts"
        body, sub = got
        prompt, query = sub(prompt), sub(query)
        refs = [DocRef(doc_id=r.doc_id, version=None if r.version is None else t.version)
                if r.doc_id == doc else r for r in refs]  # fmt: skip
        gen_of[doc] = gens[(i.tenant, doc)]
    if ident.template_version.startswith("sys-") and _systems(body) != _systems(req.body):
        return None, (
            "its documents sit in the system prompt, whose digest is the template version: "
            "the new text is a new template (send X-Stoker-Template-Version)"
        )
    new_req = replace(req, body=body, prompt=prompt, docs=tuple(refs), doc_generations=gen_of)
    item = replace(
        i.item, request=new_req, identity=replace(ident, prompt=query, docs=new_req.docs)
    )
    versions = ", ".join(f"{d} v{texts[(i.tenant, d)].version}" for d in docs)
    return replace(i, query=query, item=item, reason=f"{i.reason}; renewed: {versions}"), ""


def _systems(body: Mapping[str, Any]) -> list[Any]:
    msgs = body.get("messages")
    if not isinstance(msgs, list):
        return []
    return [m.get("content") for m in msgs if isinstance(m, dict) and m.get("role") in PREFIX_ROLES]
