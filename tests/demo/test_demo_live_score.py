"""The live demo's scorer on constructed ledgers: crossed, shared, stale, ambiguous, retired."""

from __future__ import annotations

from typing import Any

import pytest

from demo.live.ledger import Generation, Reading, asked
from demo.live.score import Attributor, Cutover, Replacement, ServedHit, Verdict
from demo.live.texts import PROMPTS, article, revisions_in, system_message, tenant_of


def gen(
    text: str,
    tenant: str | None = "acme",
    *,
    at: float = 10.0,
    docs: tuple[tuple[str, int], ...] = (),
    source: str = "live",
    server: int = 1,
    finish: str = "stop",
    status: int = 200,
) -> Generation:
    return Generation(
        source=source, server=server, tenant=tenant, docs=docs, question="q", text=text,
        finish=finish, status=status, started=at - 1.0, ended=at,
    )  # fmt: skip


def judge(gens: list[Generation], hit: ServedHit, **kw: Any) -> Verdict:
    return Attributor(gens, **kw).judge(hit)


def test_attributor__own_text_is_neither_crossed_nor_shared():
    v = judge(
        [gen("Freeze it under Cards > Freeze.")],
        ServedHit("acme", "Freeze it under Cards > Freeze.", 20.0),
    )
    assert v == Verdict()


def test_attributor__text_only_written_for_another_tenant_is_crossed():
    v = judge(
        [gen("Call Globex on +1 555 0100.", "globex")],
        ServedHit("acme", "Call Globex on +1 555 0100.", 20.0),
    )
    assert v.crossed and not v.mixed


def test_attributor__text_written_for_both_tenants_is_shared_not_crossed():
    gens = [
        gen("I'm sorry for any confusion", "globex"),
        gen("I'm sorry for any confusion", "acme"),
    ]
    v = judge(gens, ServedHit("acme", "I'm sorry for any confusion", 20.0))
    assert v.mixed and not v.crossed


def test_attributor__a_text_written_after_the_hit_or_never_whole_is_no_source():
    later = gen("x", at=30.0)
    cut = gen("y", finish="length")
    failed = gen("z", status=500)
    assert judge([later], ServedHit("acme", "x", 20.0)).unattributed
    assert judge([cut], ServedHit("acme", "y", 20.0)).unattributed
    assert judge([failed], ServedHit("acme", "z", 20.0)).unattributed


@pytest.mark.parametrize("source", ["prefix", "probe"])
def test_attributor__prefix_warms_and_probes_are_no_source(source: str):
    """Neither is ever stored: a hit cannot have come from one, so one for this tenant must
    not hide a crossed hit."""
    gens = [gen("t", "globex"), gen("t", "acme", source=source)]
    assert judge(gens, ServedHit("acme", "t", 20.0)).crossed


def test_attributor__stale_only_once_the_revision_was_replaced():
    old = gen("Open Settings > Help.", docs=(("kb/card_declined", 1),), at=10.0)
    kb = [Replacement("acme", "kb/card_declined", 1, at=15.0)]
    assert not judge([old], ServedHit("acme", "Open Settings > Help.", 12.0), replacements=kb).stale
    assert judge([old], ServedHit("acme", "Open Settings > Help.", 20.0), replacements=kb).stale


def test_attributor__another_tenants_replacement_leaves_this_tenants_answer_fresh():
    old = gen("Open Settings > Help.", docs=(("kb/card_declined", 1),))
    kb = [Replacement("globex", "kb/card_declined", 1, at=15.0)]
    assert not judge([old], ServedHit("acme", "Open Settings > Help.", 20.0), replacements=kb).stale


def test_attributor__text_written_from_old_and_new_revision_is_stale_ambiguous():
    """The change did not change the answer: serving it is not stale, and it is counted apart."""
    gens = [
        gen("Change your oil yearly.", docs=(("kb/oil_change_when", 1),), at=10.0),
        gen("Change your oil yearly.", docs=(("kb/oil_change_when", 2),), at=16.0),
    ]
    kb = [Replacement("acme", "kb/oil_change_when", 1, at=15.0)]
    v = judge(gens, ServedHit("acme", "Change your oil yearly.", 20.0), replacements=kb)
    assert v.stale_ambiguous and not v.stale


def test_attributor__retired_model_after_the_cutover_and_ambiguous_when_both_wrote_it():
    cut = Cutover(at=15.0, old_servers=frozenset({1}))
    only_old = [gen("a", server=1)]
    both = [gen("b", server=1), gen("b", server=3, at=14.0)]
    assert not judge(only_old, ServedHit("acme", "a", 12.0), cutover=cut).retired
    assert judge(only_old, ServedHit("acme", "a", 20.0), cutover=cut).retired
    v = judge(both, ServedHit("acme", "b", 20.0), cutover=cut)
    assert v.retired_ambiguous and not v.retired


def test_tally__counts_each_kind_and_keeps_examples():
    gens = [gen("own"), gen("theirs", "globex")]
    hits = [
        ServedHit("acme", "own", 20.0),
        ServedHit("acme", "theirs", 20.0),
        ServedHit("acme", "none", 20.0),
    ]
    t = Attributor(gens).tally(hits).as_dict()
    assert (t["hits"], t["crossed"], t["unattributed"], t["stale"]) == (3, 1, 1, 0)
    assert t["examples"]["crossed"] == ["acme: theirs"]


def test_tally__ambiguous_counts_a_hit_once_though_several_checks_find_it_so():
    """The summary said `mixed 13, stale_ambiguous 7, retired_ambiguous 12 (of 25 hits)`: 32
    of 25, since each is one check's. A generic answer both tenants got from both servers is
    ambiguous for the tenant check and the retired one: one ambiguous hit."""
    cut = Cutover(at=15.0, old_servers=frozenset({1}))
    gens = [gen("Sorry.", server=1), gen("Sorry.", server=3, at=16.0), gen("Sorry.", "globex"),
            gen("Thanks.", server=3, at=16.0), gen("Thanks.", "globex", server=3, at=16.0)]  # fmt: skip
    hits = [ServedHit("acme", "Sorry.", 20.0), ServedHit("acme", "Thanks.", 20.0)]
    t = Attributor(gens, cutover=cut).tally(hits).as_dict()
    assert (t["mixed"], t["retired_ambiguous"], t["stale_ambiguous"]) == (2, 1, 0)
    assert t["ambiguous"] == 2 and t["hits"] == 2


# -- what the ledger reads from a request and a response --


@pytest.mark.parametrize("short", [False, True])
def test_texts__a_system_message_says_its_tenant_and_revisions(short: bool):
    msg = system_message("globex", {"kb/plug_type": 2, "kb/card_declined": 1}, short=short)
    assert tenant_of(msg) == "globex"
    assert revisions_in(msg) == {"kb/plug_type": 2, "kb/card_declined": 1}
    assert tenant_of("You are a helpful assistant.") is None


def test_texts__every_tenants_article_changes_between_revisions():
    for tenant in PROMPTS:
        for doc in ("kb/card_declined", "kb/oil_change_when", "kb/plug_type"):
            one, two = article(tenant, doc, 1), article(tenant, doc, 2)
            assert one != two
            # the marker is inside the text: renewing a logged body renews the marker too
            assert revisions_in(two) == {doc: 2}


def test_ledger__reads_a_chat_body():
    body = {
        "messages": [
            {"role": "system", "content": system_message("acme", {"kb/card_declined": 2})},
            {"role": "user", "content": "why was my card declined"},
        ]
    }
    assert asked(body) == ("acme", (("kb/card_declined", 2),), "why was my card declined")


def test_ledger__reads_an_sse_stream_split_anywhere():
    stream = (
        b'data: {"choices":[{"delta":{"content":"Freeze "},"finish_reason":null}]}\r\n\r\n'
        b'data: {"choices":[{"delta":{"content":"it"},"finish_reason":null}]}\r\n\r\n'
        b'data: {"choices":[{"delta":{},"finish_reason":"stop"}],'
        b'"timings":{"prompt_ms":12.5,"predicted_ms":30.0}}\r\n\r\n'
        b"data: [DONE]\r\n\r\n"
    )
    r = Reading()
    for i in range(0, len(stream), 7):
        r.feed_sse(stream[i : i + 7])
    r.feed_sse(b"\n")
    assert "".join(r.parts) == "Freeze it"
    assert r.finish == "stop"
    assert r.timings == {"prompt_ms": 12.5, "predicted_ms": 30.0}


# -- false semantic hits, by the served entry's question --


def _row(prompt: str, intent: str, tenant: str = "acme") -> dict[str, Any]:
    return {
        "tenant": tenant, "prompt": prompt, "intent": intent, "context_docs": "[]",
        "params": '{"temperature":0.0,"max_tokens":512}',
    }  # fmt: skip


def test_false_semantic__a_hit_from_another_intents_question_or_for_an_oos_asker_is_false():
    from datetime import UTC, datetime

    from demo.live.client import Served, digest_of, request_of
    from demo.live.report import false_semantic
    from demo.live.run import LiveResult
    from demo.live.scenario import LiveScenario, LiveTraffic

    sc = LiveScenario()
    cached = [
        _row("how long do i cook chicken", "cook_time"),
        _row("is my card frozen", "freeze_account"),
    ]
    asked = [
        _row("how long should chicken cook", "cook_time"),  # true: same intent
        _row("how long should a turkey roast", "oos"),  # false: out of scope
        _row("how long until my card thaws", "freeze_account"),  # false: served cook_time's
    ]
    digests = [digest_of(*request_of(r, sc, {})) for r in cached]
    served_from = [digests[0], digests[0], digests[0]]
    served = [
        Served(i, "acme", 9, 200, "semantic", "x", 1.0, 5.0, 5.0, key, "v1")
        for i, key in enumerate(served_from)
    ]
    traffic = LiveTraffic(
        week1=cached, day=asked, start=datetime(2026, 11, 10, tzinfo=UTC), salt="s0"
    )
    res = LiveResult(sc, traffic, served=served)
    got = false_semantic(res)
    assert (got["semantic_hits"], got["false"], got["unknown_entry"]) == (3, 2, 0)


def test_busy_seconds__overlapping_requests_count_once():
    from demo.live.report import busy_seconds

    spans = [gen("a", at=10.0), gen("b", at=10.5), gen("c", at=20.0)]  # each lasts 1 s
    # 9-10 and 9.5-10.5 overlap: 1.5 s; then 19-20: 1 s
    assert busy_seconds(spans) == pytest.approx(2.5)
    assert busy_seconds([]) == 0.0
