"""eval-semantic --candidates: label-free checks side by side, each backend answer asked once,
a per-entry threshold learned from verdicts, and a monitor that says when its bound is empty."""

from __future__ import annotations

import re
import time
from typing import Any

import numpy as np
import orjson
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from caches.matching.calibration import AnswerSignal
from caches.matching.error_budget import LevelBound
from evals.answers import (
    AnswerCache,
    AskParams,
    BackendAnswers,
    Endpoint,
    served_model,
)
from evals.candidates import (
    Candidates,
    CheckedRule,
    LearnedRule,
    converge,
    measure,
    pair_signal,
)
from evals.checks import JUDGE_SYSTEM, PairJudge, Tally, parse_verdict
from evals.real import NOT_STARTED
from evals.semantic import Stream, _Tally, evaluate, run_stream
from tests.gateway.upstreams import Served


@pytest.mark.parametrize(
    ("said", "verdict"),
    [
        ("Yes", True), (" yes.", True), ("**YES**", True), ('"No', False), ("no,", False),
        ("Not", False), ("The same", True), ("Different", False), ("", None), ("Maybe", None),
        ("1.", None),
    ],
)  # fmt: skip
def test_parse_verdict__the_first_word_that_says_yes_or_no(said, verdict):
    assert parse_verdict(said) is verdict


def test_learned_rule__threshold_falls_to_where_enough_verdicts_agree_and_none_disagrees():
    rule = LearnedRule("d", check=None, start=0.90, floor=0.80, agree=2)  # type: ignore[arg-type]
    assert rule.threshold(0) == 0.90  # no verdict: the prompt-only rule's cosine
    rule.verdicts[0] = [(0.88, True)]
    assert rule.threshold(0) == 0.90  # one agreeing verdict is not enough
    rule.verdicts[0] += [(0.85, True), (0.83, True)]
    assert rule.threshold(0) == 0.83
    rule.verdicts[0] += [(0.86, False)]  # a disagreement stops the walk down at it
    assert rule.threshold(0) == 0.90
    rule.verdicts[1] = [(0.95, True), (0.92, True), (0.70, True)]
    assert rule.threshold(1) == 0.80  # never under the floor


def _unit(rows: list[list[float]]) -> np.ndarray:
    v = np.asarray(rows, dtype=np.float32)
    return v / np.linalg.norm(v, axis=1, keepdims=True)


def _stream(texts: list[str], vecs: np.ndarray, labels: list[str]) -> Stream:
    answers = [f"answer to {t}" for t in texts]
    return Stream(texts, labels, "oos", vecs, answers, vecs, answers, vecs)


class _Stub:
    """A check whose answers come from `backend` (query, entry) -> verdict, kept once asked:
    what AskingCheck does with the answer cache, without a server."""

    def __init__(self, backend: dict[tuple[str, int], bool]) -> None:
        self.backend, self.kept = backend, {}
        self.wanted: set[Any] = set()
        self.asked: list[Any] = []
        self.tally, self.seen = Tally(), {}

    def begin(self) -> None:
        self.tally, self.seen = Tally(), {}

    def verdict(self, query: str, entry: int) -> bool | None:
        if (query, entry) not in self.kept:
            self.wanted.add((query, entry))
            self.tally.add(None, False)
            return None
        v = self.kept[(query, entry)]
        self.tally.add(v, True)
        self.seen[(query, entry)] = v
        return v

    def fetch(self, deadline: float | None, progress: Any) -> int:
        self.asked += sorted(self.wanted)
        self.kept.update({k: self.backend[k] for k in self.wanted})
        n, self.wanted = len(self.wanted), set()
        return n

    def cost(self) -> tuple[int, float]:
        return len(self.seen), 0.0


def test_converge__asks_each_pair_once_then_serves_on_the_checks_yes():
    # 0 stored; 1 is near 0 (the check says yes: served); 2 is near 0 (says no: a miss)
    vecs = _unit([[1, 0, 0], [1, 0.05, 0], [1, 0, 0.06], [0, 1, 0]])
    st = _stream(["a", "a2", "b", "c"], vecs, ["A", "A", "B", "C"])
    check = _Stub({("a2", 0): True, ("b", 0): False})
    rule = CheckedRule("judge_0.80", 0.80, check)  # type: ignore[arg-type]
    row = converge(lambda: run_stream("judge", rule, st), [check], None)  # type: ignore[list-item]
    assert check.asked == [("a2", 0), ("b", 0)]  # the first run met both, unanswered
    assert (row.hits, row.wrong, row.served) == (1, 0, [(1, 0)])
    assert check.tally.as_dict() == {"yes": 1, "no": 1, "unclear": 0, "unknown": 0}
    # a spent budget asks nothing: the pairs stay unjudged and nothing is served on them
    fresh = _Stub({("a2", 0): True, ("b", 0): False})
    rule = CheckedRule("judge_0.80", 0.80, fresh)  # type: ignore[arg-type]
    spent = time.monotonic() - 1
    row = converge(lambda: run_stream("j", rule, st), [fresh], spent)  # type: ignore[list-item]
    assert fresh.asked == [] and row.hits == 0 and fresh.tally.unknown == 2


def test_learned_rule__two_agreeing_misses_open_an_entry_below_the_prompt_rule():
    # Queries 1 and 2 sit at cosine ~0.86 of entry 0: both miss (0.90 to start), and the
    # shadow verdicts of both agree; query 3, at ~0.87, is then served from entry 0.
    base = np.array([1.0, 0, 0, 0, 0])
    others = [np.array([0, 1.0, 0, 0, 0]), np.array([0, 0, 1.0, 0, 0]), np.array([0, 0, 0, 1.0, 0])]
    vecs = _unit([base.tolist()] + [(base + 0.58 * o).tolist() for o in others])
    st = _stream(["e", "q1", "q2", "q3"], vecs, ["E"] * 4)
    check = _Stub({("q1", 0): True, ("q2", 0): True, ("q3", 0): True})
    holder: list[LearnedRule] = []

    def run() -> Any:
        holder[:] = [LearnedRule("learned", check)]  # type: ignore[arg-type]
        return run_stream("learned", holder[0], st, after_miss=holder[0].after_miss)

    row = converge(run, [check], None)  # type: ignore[list-item]
    assert row.served == [(3, 0)]
    assert holder[0].threshold(0) < 0.90


def test_pair_signal__scores_each_checks_yes_on_right_and_wrong_pairs_after_the_fact():
    st = _stream(["a", "a2", "b", "z"], _unit([[1, 0]] * 4), ["A", "A", "B", "oos"])
    seen = {("a2", 0): True, ("b", 0): True, ("z", 0): False, ("b", 1): None}
    got = pair_signal(seen, st)
    assert (got["pairs_same_intent"], got["yes_same_intent"]) == (1, 1.0)
    # b is another intent, z out of scope: both count as pairs that must not be served
    assert (got["pairs_other_intent"], got["yes_other_intent"]) == (3, pytest.approx(1 / 3, 0.01))


def test_monitor__its_bound_is_none_with_a_reason_when_the_answers_are_blind():
    t = _Tally(checked=10, judged_wrong=4, truly_wrong=0)
    blind = AnswerSignal(LevelBound(0, 200, 60), LevelBound(0, 200, 50))
    assert blind.state == "blind"
    out = t.as_dict(blind)
    assert out["monitor_bound"] is None and out["monitor_informative"] is False
    assert "blind" in out["monitor_reason"] and out["monitor_answer_bound"] > 0.4
    apart = AnswerSignal(LevelBound(0, 400, 2), LevelBound(0, 400, 1))
    assert apart.state == "separates"
    sep = t.as_dict(apart)
    assert sep["monitor_bound"] == pytest.approx(out["monitor_answer_bound"])
    assert sep["monitor_informative"] is True and "monitor_reason" not in sep
    assert t.as_dict(None)["monitor_bound"] is None  # no answer check ran: nothing shows


def test_endpoint__starts_the_server_only_for_an_answer_the_cache_lacks(tmp_path):
    cache = AnswerCache(tmp_path / "a.sqlite3")
    params = AskParams("m", max_tokens=2)
    cache.put(params.key("kept", 0), "yes", 5.0, "stop")
    started: list[str] = []

    class Started(Exception):
        pass

    def start() -> str:
        started.append("now")
        raise Started

    answers = BackendAnswers(Endpoint(NOT_STARTED, start), params, cache)
    answers.fetch(["kept"])
    answers.fetch(["missing"], deadline=time.monotonic() - 1)  # spent: nothing is asked
    assert started == [] and answers.texts(["kept", "missing"]) == {"kept": "yes"}
    assert answers.server_seconds(["kept"]) == pytest.approx(0.005)
    with pytest.raises(Started):
        answers.sibling(AskParams("m", temperature=0.7)).fetch(["missing"])
    assert started == ["now"]


# The label-free judge a scripted server plays: two requests are "the same" when they share
# their first word; any other prompt gets an answer naming its first word.
_QUOTED = re.compile(r'"([^"]*)"')


def _scripted(calls: list[str]) -> Starlette:
    async def chat(request: Request) -> Response:
        body = orjson.loads(await request.body())
        system, user = (m["content"] for m in body["messages"])
        calls.append(user)
        if system == JUDGE_SYSTEM:
            a, b = _QUOTED.findall(user)[:2]
            text = "Yes" if a.split()[0] == b.split()[0] else "No"
        else:
            text = f"about {user.split()[0]}"
        answer = {
            "id": "x", "object": "chat.completion", "created": 1, "model": body["model"],
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                         "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 7, "completion_tokens": 1, "total_tokens": 8},
        }  # fmt: skip
        return Response(orjson.dumps(answer), media_type="application/json")

    return Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"])])


ROWS = [
    ("what is my account balance", "balance"), ("how much money is in my account", "balance"),
    ("tell me my account balance", "balance"), ("set a timer for ten minutes", "timer"),
    ("start a ten minute timer", "timer"), ("set a timer for ten minutes please", "timer"),
    ("what is the weather like today", "weather"), ("what's the weather today", "weather"),
    ("what is my savings account balance", "balance"), ("tell me a joke", "joke"),
    ("tell me a funny joke", "joke"), ("set an alarm for ten", "alarm"),
]  # fmt: skip


def _fake(rows: list[tuple[str, str]]) -> tuple[list[str], list[str]]:
    out = [f"about {t.split()[0]}" for t, _ in rows]
    return out, out


def test_measure__every_candidate_side_by_side_and_a_rerun_asks_nothing(embedder, tmp_path):
    ev = evaluate(
        embedder, rows=ROWS, history=[], names=["static_0.92", "stoker"], answers=_fake,
        answers_from="scripted", shuffle=False,
    )  # fmt: skip
    cache = AnswerCache(tmp_path / "a.sqlite3")
    calls: list[str] = []
    with Served(_scripted(calls)) as up:
        answers = BackendAnswers(f"{up.url}/v1", AskParams("scripted"), cache)
        c = Candidates(ev, answers, embedder, budget_s=60, floors=(0.80,), cuts=(0.86,))
        first = measure(c, seed=7, monitor_share=0.2, full=False)
    names = [r["name"] for r in first["candidates"]]
    assert names == [
        "shipped", "guarded_0.86", "judge_0.80", "learned_answers", "learned_judge", "reask_0.80",
    ]  # fmt: skip
    by = {r["name"]: r for r in first["candidates"]}
    assert by["judge_0.80"]["extra_calls"] > 0 and by["guarded_0.86"]["extra_calls"] == 0
    assert all(r["wrong_bound"] >= r["wrong_share"] for r in first["candidates"])
    assert first["candidates_asked"] == len(calls) > 0
    assert len(set(calls)) == len(calls)  # each answer asked once, across all candidates
    assert all(r["unjudged"] == 0 for r in first["candidates"] if "unjudged" in r)
    assert first["best"] in names and first["static092_hits"] == ev.row("static_0.92").hits
    assert set(first["monitor"]["shipped"]) >= {"judge", "answers", "true_wrong"}
    # A rerun reads every answer from the cache: the server is gone, nothing is asked.
    idle = BackendAnswers(NOT_STARTED, AskParams("scripted"), cache)
    again = Candidates(ev, idle, embedder, floors=(0.80,), cuts=(0.86,))
    second = measure(again, seed=7, monitor_share=0.2, full=False)
    assert second["candidates_asked"] == 0
    assert second["candidates"] == first["candidates"]


def test_pair_judge__the_real_model_is_asked_once_per_pair(llama, tmp_path):
    texts = ["what is my account balance", "how much money is in my account", "tell me a joke"]
    params = PairJudge.params(served_model(llama.base_url))
    judge = PairJudge(BackendAnswers(llama.base_url, params, AnswerCache(tmp_path / "a")), texts)
    assert judge.verdict(texts[1], 0) is None and judge.verdict(texts[2], 0) is None
    assert judge.tally.unknown == 2 and len(judge.wanted) == 2  # not asked yet: nothing served
    assert judge.fetch(None, lambda _: None) == 2 and not judge.wanted
    judge.begin()
    said = [judge.verdict(texts[1], 0), judge.verdict(texts[2], 0)]
    assert all(v in (True, False, None) for v in said) and judge.tally.unknown == 0
    calls, server_s = judge.cost()
    assert calls == 2 and server_s > 0  # llama.cpp's own timings, read back from the cache
    judge.wanted.add(judge.prompt_of(texts[1], 0))  # kept: read back, not asked again
    assert judge.fetch(None, lambda _: None) == 1 and judge.answers.report.asked == 2
