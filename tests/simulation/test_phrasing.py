"""The simulator answers like a model: paraphrases agree in meaning, not in text; specifics
carry over; look-alike questions of another meaning get answers that the embedder tells apart.
Measured with the real all-MiniLM-L6-v2 on CLINC150 utterances (labels pick the pairs only)."""

from __future__ import annotations

import random
from typing import Any

import numpy as np

from caches.matching.answers import AnswerJudge
from simulation.backend.simulator import SimConfig, Simulator
from simulation.logs.sample import load_clinc

MODEL = "sim-model"


def _sim(meanings: dict[str, str], vary: bool = True) -> Simulator:
    return Simulator(SimConfig(meanings=meanings, vary_wording=vary, default_max_tokens=64))


def _answer(sim: Simulator, prompt: str) -> str:
    return sim.answer_for(MODEL, prompt, None).text


def test_phrasing__the_same_prompt_gets_the_same_text_unless_wording_varies() -> None:
    p = "how do i transfer money to my savings account"
    assert _answer(_sim({}, vary=False), p) == _answer(_sim({}, vary=False), p)
    varied = _sim({})
    texts = {_answer(varied, p) for _ in range(5)}
    assert len(texts) == 5  # sampling: no two calls need agree word for word


def test_phrasing__specifics_reach_the_answer_and_tell_amounts_apart() -> None:
    sim = _sim({}, vary=False)
    a = _answer(sim, "transfer 50 eur to Bob")
    b = _answer(sim, "transfer 500 eur to Bob")
    assert "50" in a.split() and "500" not in a.split()
    assert "500" in b.split()
    assert "Bob" in a and "Bob" in b
    assert a != b


def test_phrasing__paraphrase_answers_agree_look_alike_answers_do_not(embedder: Any) -> None:
    """Over 40 intents: two answers to two paraphrases are closer than the answers to the
    paraphrase and to the nearest question of another intent, for the large majority, and the
    judge's default bar separates them with few errors either way."""
    data = load_clinc("test")
    rng = random.Random(3)
    intents = rng.sample(sorted(data), 40)
    prompts = [(i, p) for i in intents for p in data[i][:3]]
    meanings = {p: i for i, p in prompts}  # what a model would understand; never read below
    sim = _sim(meanings)
    texts = [p for _, p in prompts]
    qv = embedder.embed(texts)
    av = embedder.embed([_answer(sim, p) for p in texts])
    labels = np.array([i for i, _ in prompts])
    q_sim = qv @ qv.T
    np.fill_diagonal(q_sim, -1)
    same, other = [], []
    for k in range(len(prompts)):
        mates = np.flatnonzero(labels == labels[k])
        mate = next(m for m in mates if m != k)
        strangers = np.flatnonzero(labels != labels[k])
        nearest = strangers[np.argmax(q_sim[k, strangers])]
        same.append(float(av[k] @ av[mate]))
        other.append(float(av[k] @ av[nearest]))
    same_a, other_a = np.array(same), np.array(other)
    assert (same_a > other_a).mean() >= 0.9
    bar = AnswerJudge().bar
    assert (same_a < bar).mean() <= 0.05  # paraphrase answers judged different
    assert (other_a >= bar).mean() <= 0.05  # look-alike answers judged the same


def test_phrasing__the_judge_refuses_answers_whose_numbers_differ(embedder: Any) -> None:
    sim = _sim({"send 50 eur to Bob": "m", "send 500 eur to Bob": "m"}, vary=False)
    a, b = _answer(sim, "send 50 eur to Bob"), _answer(sim, "send 500 eur to Bob")
    va, vb = embedder.embed([a, b])
    verdict = AnswerJudge().judge(va, vb, a, b)
    assert verdict.cosine >= AnswerJudge().bar  # one meaning: the vectors alone would agree
    assert not verdict.same and verdict.reason == "number"
