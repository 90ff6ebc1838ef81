"""eval-semantic on a real model: answers asked once and kept on disk, a time budget that cuts
the sample to what was answered, and the matcher's fallback on answers that tell nothing."""

from __future__ import annotations

import hashlib
import time

import orjson
import pytest

from evals.answers import AnswerCache, AskParams, BackendAnswers, served_model
from evals.real import (
    NOT_STARTED,
    Sample,
    answered_sample,
    backend_answers,
    interleaved,
)
from evals.semantic import TRUSTING, evaluate
from stoker.modelserver import MODEL_ALIAS
from tests.cli import run_stoker

PROMPTS = ["what is my account balance", "set a timer for ten minutes", "tell me a joke"]


def test_backend_answers__asked_once_then_read_from_disk(llama, tmp_path):
    url = llama.base_url
    params = AskParams(served_model(url), max_tokens=8)
    first = BackendAnswers(url, params, AnswerCache(tmp_path / "a.sqlite3"))
    live, again = first.pairs(PROMPTS)
    # Temperature 0: the live answer and the re-ask are one request, asked once.
    assert first.report.asked == 3 and first.report.cached == 0
    assert live == again and all(isinstance(t, str) and t for t in live)
    assert first.report.server_s > 0  # llama.cpp's own timings
    again_run = BackendAnswers(url, params, AnswerCache(tmp_path / "a.sqlite3"))
    assert again_run.pairs(PROMPTS) == (live, again)
    assert (again_run.report.asked, again_run.report.cached) == (0, 3)
    # Another temperature is another key, and its re-ask another sample.
    warm = BackendAnswers(url, AskParams(params.model, max_tokens=8, temperature=0.7),
                          AnswerCache(tmp_path / "a.sqlite3"))  # fmt: skip
    warm.pairs(PROMPTS[:1])
    assert warm.report.asked == 2


def test_answered_sample__a_spent_budget_cuts_each_list_to_its_answered_prefix(tmp_path):
    params = AskParams("m", max_tokens=8)
    cache = AnswerCache(tmp_path / "a.sqlite3")
    stream = [(f"q{i}", "l") for i in range(5)]
    history = [(f"h{i}", "l") for i in range(4)]
    for text in ("q0", "q1", "q3", "h0"):
        cache.put(params.key(text, 0), f"answer to {text}", 1.0, "stop")
    # Nothing listens there: a budget already spent asks nothing, so nothing connects.
    answers = BackendAnswers("http://127.0.0.1:9/v1", params, cache)
    got = answered_sample(answers, Sample(stream, history), budget_s=0.0)
    assert (got.stream, got.history) == (stream[:2], history[:1])  # q2 unanswered cuts q3
    assert answers.report.asked == 0 and answers.report.failed == 0


def test_backend_answers__a_rerun_of_the_embedded_default_starts_no_server(tmp_path):
    cache = AnswerCache(tmp_path / "a.sqlite3")
    s = Sample([("q0", "l"), ("q1", "l")], [("h0", "l")])
    said: list[str] = []
    alias = MODEL_ALIAS  # the embedded server's --alias keys its answers
    for text in ("q0", "q1", "h0"):
        cache.put(AskParams(alias).key(text, 0), f"answer to {text}", 1.0, "stop")
    with backend_answers(None, None, AskParams, cache, s, said.append) as answers:
        assert answers.base_url == NOT_STARTED and answers.params.model == alias
        assert answers.pairs(["q0", "q1"]) == (["answer to q0", "answer to q1"],) * 2
    assert answers.report.asked == 0 and "not started" in said[0]


def test_interleaved__each_list_keeps_its_share_of_every_prefix():
    out = interleaved([f"s{i}" for i in range(6)], ["h0", "h1", "h2"])
    assert out == ["s0", "s1", "h0", "s2", "s3", "h1", "s4", "s5", "h2"]


def _blind(rows: list[tuple[str, str]]) -> tuple[list[str], list[str]]:
    """A backend whose answers say nothing of the question: one of three stock replies, chosen
    by a hash of the text (so look-alikes and unrelated prompts agree alike)."""
    stock = [
        "I'm sorry, as a voice assistant I can't help with that right now.",
        "Sure! Let me know if there is anything else you need today.",
        "That is a great question; here is some general information about it.",
    ]
    out = [stock[hashlib.sha256(t.encode()).digest()[0] % 3] for t, _ in rows]
    return out, out


def test_evaluate__answers_that_tell_nothing_put_it_on_the_prompt_rule_never_below_static(
    embedder,
):
    ev = evaluate(
        embedder, limit=500, answers=_blind, answers_from="blind",
        names=["static_0.92", "guarded_0.92", "stoker", TRUSTING],
    )  # fmt: skip
    static, ours = ev.row("static_0.92").as_dict(), ev.row("stoker").as_dict()
    # the guards only take hits away, and never a right one for a wrong one here
    guarded = ev.row("guarded_0.92").as_dict()
    assert 0 < guarded["hits"] <= static["hits"]
    assert guarded["wrong_hits"] <= static["wrong_hits"]
    assert ours["answers"] == "blind" and ours["answers_false_agree"] > 0.2
    assert ours["hits"] > 0 and all(":fallback:" in r for r in ours["hits_by_rule"])
    assert ours["hits"] >= static["hits"] and ours["wrong_share"] <= static["wrong_share"]
    s = ev.summary()
    assert s["answers_from"] == "blind" and s["answers"] == "blind"
    # The monitor judges by those same answers: it says its bound means nothing, and why.
    assert s["monitor_bound"] is None and s["monitor_informative"] is False
    assert "blind" in s["monitor_reason"] and s["bound_covers"] is None
    # Durations are each a percentile of their own, never a difference of two.
    assert 0 <= s["verification_ms_p50"] <= s["verification_ms_p99"]
    assert TRUSTING in {r.name for r in ev.rows}


def test_cli__eval_semantic_on_a_backend_asks_then_reads_its_answer_cache(llama, tmp_path):
    args = [
        "eval-semantic", "--backend", llama.base_url, "--limit", "12", "--history-limit", "4",
        "--max-tokens", "8", "--answer-cache", str(tmp_path / "a.sqlite3"), "--json",
        "--only", "static_0.92,stoker",
    ]  # fmt: skip
    runs = []
    for _ in range(2):
        t0 = time.monotonic()
        res = run_stoker(*args, env={"HF_HUB_OFFLINE": "1"}, timeout=600)
        assert res.returncode == 0, res.stderr[-2000:]
        lines = [orjson.loads(x) for x in res.stdout.splitlines() if x.startswith("{")]
        real = next(x for x in lines if x.get("name") == "semantic_quality_clinc_real")
        runs.append((real, res.stderr, time.monotonic() - t0))
    (first, err, _), (second, err2, _) = runs
    assert first["answers_asked"] == 16 and first["queries"] == 12
    assert first["answers_from"].startswith(f"real: {served_model(llama.base_url)}")
    assert "asked the backend for 16 answers" in err
    assert second["answers_asked"] == 0 and second["answers_cached"] == 16
    assert "asked the backend for 0 answers" in err2
    assert second["candidates"]["static_0.92"] == first["candidates"]["static_0.92"]


@pytest.mark.parametrize("bad", [["--simulated", "--backend", "http://x:1/v1"]])
def test_cli__simulated_takes_no_backend(bad):
    res = run_stoker("eval-semantic", *bad, timeout=120)
    assert res.returncode == 2 and "--simulated takes no --backend" in res.stderr
