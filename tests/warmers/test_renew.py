"""Documents' texts after a KB change (what a re-warm substitutes) and the substitution itself."""

from __future__ import annotations

import pytest
import redis

from caches import keys as K
from warmers.hotset.renew import KEEP_OLD, DocText, DocTexts, renew

pytestmark = pytest.mark.topologies


def test_doc_texts__keep_the_newest_text_and_the_ones_it_replaced_per_tenant(
    redis_client: redis.Redis,
) -> None:
    texts = DocTexts(redis_client, ttl_s=60)
    assert texts.read([("acme", "d")]) == {}
    assert texts.note("acme", "d", 2, "two", "one")
    assert texts.note("acme", "d", 3, "three", None)  # no before image: the kept text is one
    assert not texts.note("acme", "d", 1, "zero", None)  # a replayed older change: no step back
    assert texts.note("globex", "d", 9, "theirs", "their old")
    got = texts.read([("acme", "d"), ("globex", "d"), ("initech", "d")])
    assert got == {
        ("acme", "d"): DocText(3, "three", ("two", "one")),
        ("globex", "d"): DocText(9, "theirs", ("their old",)),
    }
    # The same version again adds a before image it lacked, and never lists the text itself.
    assert texts.note("acme", "d", 3, "three", "two-b")
    assert texts.note("acme", "d", 3, "three", "three")
    assert texts.read([("acme", "d")])[("acme", "d")].old == ("two", "one", "two-b")
    for v in range(4, 4 + KEEP_OLD + 2):
        texts.note("acme", "d", v, f"v{v}", None)
    assert len(texts.read([("acme", "d")])[("acme", "d")].old) == KEEP_OLD  # bounded
    key = K.doc_text_key("acme", "d")
    assert key.startswith(K.tenant_tag("acme") + ":")  # the tenant's slot
    assert 0 < redis_client.ttl(key) <= 60  # type: ignore[operator]


def test_doc_texts__a_first_change_without_a_before_image_keeps_no_old_text(
    redis_client: redis.Redis,
) -> None:
    texts = DocTexts(redis_client)
    texts.note("acme", "d", 1, "new", None)
    assert texts.read([("acme", "d")])[("acme", "d")] == DocText(1, "new", ())


def test_renew__replaces_every_old_text_in_messages_and_the_question() -> None:
    body = {
        "model": "m",
        "messages": [
            {"role": "system", "content": "ctx: OLD and old-2"},
            {"role": "user", "content": [{"type": "text", "text": "about OLD?"}]},
        ],
        "max_tokens": 9,
    }
    got = renew(body, ["OLD", "old-2", "absent"], "NEW")
    assert got is not None
    new_body, sub = got
    assert new_body["messages"][0]["content"] == "ctx: NEW and NEW"
    assert new_body["messages"][1]["content"][0]["text"] == "about NEW?"
    assert new_body["max_tokens"] == 9 and body["messages"][0]["content"] == "ctx: OLD and old-2"
    assert sub("about OLD?") == "about NEW?"


def test_renew__the_longest_old_text_wins_and_one_pass_never_rewrites_the_new() -> None:
    got = renew({"prompt": "see A B here"}, ["A", "A B"], "A B C")
    assert got is not None and got[0]["prompt"] == "see A B C here"


def test_renew__a_body_without_any_old_text_is_not_renewed() -> None:
    body = {"messages": [{"role": "system", "content": "the doc, REFORMATTED"}]}
    assert renew(body, ["the doc, reformatted"], "new") is None
    assert renew(body, [], "new") is None
