"""A miss's answer is searchable by the time its response ends, streamed or not: a paraphrase
sent the moment the client has a long answer (~1,000 characters) is served exactly when the same
paraphrase sent once the write is surely over is, through the real gateway, the simulated
backend and the openai SDK."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any

import pytest

from simulation.backend.http import SimulatorThread
from tests.gateway.conftest import FAST_SIM, GatewayFactory, client
from tests.waiting import wait_for

# Questions and a paraphrase of each (cosine 0.90-0.99, all-MiniLM-L6-v2; no guard fires).
PAIRS = [
    ("how do i reset my password", "How can I reset my password?"),
    ("what is the boiling point of water at sea level",
     "what temperature does water boil at sea level"),
    ("how long should i boil an egg", "How long do I boil an egg for?"),
    ("how do i renew my passport", "how can i renew my passport"),
]  # fmt: skip
STEPS = ["read what it asks", "gather what it needs", "do the first part", "check the result",
         "do the rest", "check again", "write down what you did", "ask for help if unsure"]  # fmt: skip


def answer(question: str, wording: int) -> str:
    """About 1,000 characters on `question`, in one of two wordings (the backend rewords)."""
    opener = ("Sure, here is how.", "Happy to help with that.")[wording]
    steps = " ".join(f"Step {k + 1}: {s}, for '{question}'." for k, s in enumerate(STEPS * 2))
    return f"{opener} {steps}"[:1000]


ANSWERS = {p: answer(pair[0], w) for pair in PAIRS for w, p in enumerate(pair)}


@pytest.fixture
def long_sim() -> Iterator[SimulatorThread]:
    """The simulated backend, answering each question and paraphrase in ~1,000 characters."""
    cfg = dataclasses.replace(FAST_SIM, answers=ANSWERS, default_max_tokens=1000)
    with SimulatorThread(cfg) as s:
        yield s


def ask(gw: Any, tenant: str, prompt: str, stream: bool) -> str:
    """The request's cache outcome, once the client has the whole answer."""
    raw = client(gw, tenant).chat.completions.with_raw_response.create(
        model="sim-model", messages=[{"role": "user", "content": prompt}], temperature=0,
        stream=stream,
    )  # fmt: skip
    if stream:
        text = "".join(c.choices[0].delta.content or "" for c in raw.parse() if c.choices)
    else:
        text = raw.parse().choices[0].message.content or ""
    assert len(text) >= 900, len(text)
    return str(raw.headers["x-stoker-cache"])


def indexed(gw: Any, tenant: str) -> int:
    """The tenant's points in the gateway's semantic store."""
    n: int = gw.parts.gate.cache.semantic.count({"tenant": tenant})
    return n


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
def test_searchable__a_paraphrase_at_once_is_served_as_one_sent_later(
    make_gateway: GatewayFactory, long_sim: SimulatorThread, stream: bool
) -> None:
    # as shipped: the verified matcher, the default index wait
    gw = make_gateway(long_sim.url)
    for i, (question, paraphrase) in enumerate(PAIRS):
        now, later = f"now-{i}", f"later-{i}"
        assert ask(gw, now, question, stream) == "miss"
        # the entry is searchable when the client has the answer: no gap to wait out
        assert indexed(gw, now) == 1, "the answer was not searchable when its response ended"
        at_once = ask(gw, now, paraphrase, stream)
        assert ask(gw, later, question, stream) == "miss"
        wait_for(lambda t=later: indexed(gw, t) == 1, 10, "the answer to be indexed")
        assert at_once == ask(gw, later, paraphrase, stream), (question, paraphrase)
