"""The planner renews a logged request whose document changed with the document's new text (a
KB change v2), or says why it cannot; on a real redis-server, through the traffic worker's
observe path."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
import redis

from caches.generations import Generations
from schemas.common import DocRef
from schemas.events import LoggedRequest, RequestLogged
from tests.warmers.hotset_helpers import WordsEmbedder, event, fill
from tests.warmers.test_hotset import MONDAY, NEXT_MONDAY_10
from warmers.hotset.options import HotSetConfig
from warmers.hotset.plan import Plan
from warmers.hotset.renew import DocTexts
from warmers.hotset.select import HotSetSelector
from warmers.hotset.warm_budget import Budget
from warmers.traffic.profile import TrafficProfile

OLD, NEW = "Refunds take 5 days.", "Refunds take 2 days."
QUESTION = "how long do refunds take"


def _logged(n: int, template: str, doc: DocRef) -> RequestLogged:
    e = event(n, "acme", QUESTION, MONDAY + timedelta(days=n % 5, hours=10, minutes=n // 5))
    body = {
        "model": "m",
        "messages": [
            {"role": "system", "content": f"Context: {OLD}"},
            {"role": "user", "content": QUESTION},
        ],
        "temperature": 0,
        "max_tokens": 16,
    }
    return RequestLogged(
        **e.model_dump(exclude={"schema_version", "template_version", "context_docs", "request",
                              "doc_generations"}),
        schema_version=2, template_version=template, context_docs=(doc,),
        request=LoggedRequest(api="chat", body=body), doc_generations={},
    )  # fmt: skip


def _plan(r: redis.Redis, template: str, doc: DocRef, **kw: Any) -> Plan:
    profile = TrafficProfile(r)
    fill(profile, [_logged(n, template, doc) for n in range(20)])
    sel = HotSetSelector(
        profile,
        WordsEmbedder(),
        config=HotSetConfig(min_value_ms=None, matcher="static", value_model="hits"),
    )
    return sel.plan(NEXT_MONDAY_10, Budget(requests=3), value_model="hits", **kw)


def test_renew__a_versioned_doc_under_its_floor_is_warmed_with_its_new_text_and_version(
    redis_client: redis.Redis,
) -> None:
    Generations(redis_client).raise_doc_floor("acme", "kb/refunds", 4)
    DocTexts(redis_client).note("acme", "kb/refunds", 4, NEW, OLD)
    plan = _plan(redis_client, "t1", DocRef(doc_id="kb/refunds", version=3))
    (item,) = plan.items
    req = item.item.request
    assert req.docs == (DocRef(doc_id="kb/refunds", version=4),)
    assert item.item.identity.docs == req.docs  # the key names the new version
    assert req.body is not None and req.body["messages"][0]["content"] == f"Context: {NEW}"
    assert "renewed: kb/refunds v4" in item.reason


def test_renew__unchanged_docs_are_warmed_as_logged(redis_client: redis.Redis) -> None:
    DocTexts(redis_client).note("acme", "kb/refunds", 3, NEW, OLD)  # a text, but no change
    (item,) = _plan(redis_client, "t1", DocRef(doc_id="kb/refunds", version=3)).items
    req = item.item.request
    assert req.docs == (DocRef(doc_id="kb/refunds", version=3),)
    assert req.body is not None and OLD in req.body["messages"][0]["content"]


@pytest.mark.parametrize(
    ("template", "floor", "text_version", "why"),
    [
        ("t1", 4, None, "its new text is not known"),
        ("t1", 5, 4, "the text known is of version 4, the doc is at 5"),  # a later change
        ("sys-0123456789abcdef", 4, 4, "the new text is a new template"),
    ],
)
def test_renew__what_cannot_be_renewed_is_left_out_with_the_reason(
    redis_client: redis.Redis, template: str, floor: int, text_version: int | None, why: str
) -> None:
    Generations(redis_client).raise_doc_floor("acme", "kb/refunds", floor)
    if text_version is not None:
        DocTexts(redis_client).note("acme", "kb/refunds", text_version, NEW, OLD)
    plan = _plan(redis_client, template, DocRef(doc_id="kb/refunds", version=3))
    assert plan.items == []
    assert any(why in sk.reason for sk in plan.skipped), [sk.reason for sk in plan.skipped]


def test_renew__a_plan_for_some_docs_holds_only_the_requests_that_name_them(
    redis_client: redis.Redis,
) -> None:
    doc = DocRef(doc_id="kb/refunds", version=3)
    assert _plan(redis_client, "t1", doc, docs={("acme", "kb/other")}).items == []
    assert _plan(redis_client, "t1", doc, docs={("globex", "kb/refunds")}).items == []
    assert len(_plan(redis_client, "t1", doc, docs={("acme", "kb/refunds")}).items) == 1
