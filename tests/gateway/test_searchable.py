"""A miss's answer is searchable by the time its response ends, streamed or not: a paraphrase
sent the moment the client has a long answer (~1,000 characters) is served exactly when the same
paraphrase sent once the write is surely over is, through the real gateway and the openai SDK."""

from __future__ import annotations

import time
from typing import Any

import pytest

from tests.gateway.conftest import GatewayFactory, client
from tests.gateway.upstreams import Script, Served
from tests.waiting import wait_for

# Questions and a paraphrase of each (cosine 0.90-0.99, all-MiniLM-L6-v2; no guard fires).
PAIRS = [
    ("how do i reset my password", "How can I reset my password?"),
    ("what is the boiling point of water at sea level",
     "what temperature does water boil at sea level"),
    ("how long should i boil an egg", "How long do I boil an egg for?"),
    ("how do i renew my passport", "how can i renew my passport"),
]  # fmt: skip
ANSWER = ("Here is what to do, step by step, with the reasons for each step. " * 16).strip()


def ask(gw: Any, tenant: str, prompt: str, stream: bool) -> tuple[str, float]:
    """The request's cache outcome, and when the client had the whole answer."""
    raw = client(gw, tenant).chat.completions.with_raw_response.create(
        model="scripted", messages=[{"role": "user", "content": prompt}], temperature=0,
        stream=stream,
    )  # fmt: skip
    if stream:
        text = "".join(c.choices[0].delta.content or "" for c in raw.parse() if c.choices)
    else:
        text = raw.parse().choices[0].message.content or ""
    assert text == ANSWER
    return raw.headers["x-stoker-cache"], time.perf_counter()


def indexed(gw: Any, tenant: str) -> int:
    """The tenant's points in the gateway's semantic store."""
    n: int = gw.parts.gate.cache.semantic.count({"tenant": tenant})
    return n


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
def test_searchable__a_paraphrase_at_once_is_served_as_one_sent_later(
    make_gateway: GatewayFactory, scripted: Served, script: Script, stream: bool
) -> None:
    script.text = ANSWER
    assert 950 <= len(ANSWER) <= 1100
    # the default index wait: no setting made for the test
    gw = make_gateway(scripted.url, semantic_matcher="verified")
    for i, (question, paraphrase) in enumerate(PAIRS):
        now, later = f"now-{i}", f"later-{i}"
        assert ask(gw, now, question, stream)[0] == "miss"
        # the entry is searchable when the client has the answer: no gap to wait out
        assert indexed(gw, now) == 1, "the answer was not searchable when its response ended"
        at_once = ask(gw, now, paraphrase, stream)[0]
        assert ask(gw, later, question, stream)[0] == "miss"
        wait_for(lambda t=later: indexed(gw, t) == 1, 10, "the answer to be indexed")
        assert at_once == ask(gw, later, paraphrase, stream)[0], (question, paraphrase)
