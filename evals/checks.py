"""Label-free checks of a look-alike that ask the backend: the model asked whether two requests
mean the same (a judge), and a re-ask of the query judged against the cached answer.

Each check answers `verdict(query, entry)` from answers already kept in the answer cache
(answers.py); a pair it has no answer for yet is `wanted` and its verdict is None
(the caller serves nothing for it), and `fetch` asks the backend for what is wanted, in parallel,
until a deadline. A stream is therefore run, the wanted answers fetched, and the stream run
again until it wants nothing new (semantic_eval_candidates.converge): only the pairs a
rule actually meets are ever asked, and a rerun asks nothing.

Nothing here reads a label: the prompts, the backend's answers and their embeddings.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from caches.embedders import Embedder
from caches.matching.answers import AnswerJudge
from caches.matching.base import Vector
from evals.answers import AskParams, BackendAnswers, Progress

# The judge's brief. SmolLM2-135M-Instruct answers a yes/no question with "Yes"/"No" first when
# told to; max_tokens 2 leaves room for a leading space or quote token before the word.
JUDGE_SYSTEM = (
    "You compare two requests made to a voice assistant. Reply with one word: yes if they ask "
    "for the same thing, no if they do not."
)
JUDGE_MAX_TOKENS = 2
# What vCache explores: another sample of the query's answer, judged against the cached one.
REASK_TEMPERATURE = 0.7

_WORD = re.compile(r"[a-z]+")
_YES = frozenset(("yes", "yeah", "yep", "same", "true"))
_NO = frozenset(("no", "nope", "not", "different", "false"))


def judge_prompt(query: str, cached: str) -> str:
    return (
        f'Request 1: "{query}"\nRequest 2: "{cached}"\n'
        "Do the two requests ask for the same thing? Answer yes or no."
    )


def parse_verdict(text: str) -> bool | None:
    """The judge's yes (True) or no (False): its first word that says one ("**Yes.**",
    ' "no', "YES,", "The same"), whatever the case, quotes, markup or punctuation around it;
    None when no word does (the caller counts it and serves nothing)."""
    for word in _WORD.findall(text.lower()):
        if word in _YES:
            return True
        if word in _NO:
            return False
    return None


@dataclass
class Tally:
    """How a check's verdicts came out over one run (yes / no / unclear / not yet asked)."""

    yes: int = 0
    no: int = 0
    unclear: int = 0
    unknown: int = 0

    def add(self, v: bool | None, known: bool) -> None:
        if not known:
            self.unknown += 1
        elif v is None:
            self.unclear += 1
        elif v:
            self.yes += 1
        else:
            self.no += 1

    def as_dict(self) -> dict[str, int]:
        return {"yes": self.yes, "no": self.no, "unclear": self.unclear, "unknown": self.unknown}


class AskingCheck:
    """A check whose verdicts need a backend answer per `prompt_of(query, entry)`. Per run
    (`begin`): the pairs it judged (`seen`, for the scorer) and the backend requests they
    rested on (`used`, for the cost)."""

    def __init__(self, answers: BackendAnswers) -> None:
        self.answers = answers
        self.wanted: set[str] = set()  # prompts not answered yet
        self.seen: dict[tuple[str, int], bool | None] = {}
        self.used: set[str] = set()
        self.tally = Tally()

    def begin(self) -> None:
        self.seen, self.used, self.tally = {}, set(), Tally()

    def prompt_of(self, query: str, entry: int) -> str:
        raise NotImplementedError

    def judge(self, query: str, entry: int, answer: str) -> bool | None:
        raise NotImplementedError

    def verdict(self, query: str, entry: int) -> bool | None:
        """True only for a clear yes; None when unclear or not answered yet (then wanted)."""
        p = self.prompt_of(query, entry)
        got = self.answers.texts([p]).get(p)
        if got is None:
            self.wanted.add(p)
            self.tally.add(None, False)
            return None
        v = self.judge(query, entry, got)
        self.tally.add(v, True)
        self.seen[(query, entry)] = v
        self.used.add(p)
        return v

    def fetch(self, deadline: float | None, progress: Progress) -> int:
        """Ask for what is wanted; how many came."""
        todo = sorted(self.wanted)
        self.answers.fetch(todo, deadline, progress)
        got = self.answers.texts(todo)
        self.wanted -= set(got)
        self.arrived(got)
        return len(got)

    def arrived(self, got: dict[str, str]) -> None:
        """Answers just fetched (a check that embeds them does it here, in one batch)."""

    def cost(self) -> tuple[int, float]:
        """This run's backend requests and what the server spent on them, whenever asked."""
        return len(self.used), self.answers.server_seconds(sorted(self.used))


class PairJudge(AskingCheck):
    """The model asked whether a query and a cached prompt ask for the same thing (temperature
    0, JUDGE_MAX_TOKENS tokens): one backend request per (query, cached prompt) pair."""

    def __init__(self, answers: BackendAnswers, texts: Sequence[str]) -> None:
        super().__init__(answers)
        self.texts = texts

    @staticmethod
    def params(model: str) -> AskParams:
        return AskParams(model, system=JUDGE_SYSTEM, max_tokens=JUDGE_MAX_TOKENS)

    def prompt_of(self, query: str, entry: int) -> str:
        return judge_prompt(query, self.texts[entry])

    def judge(self, query: str, entry: int, answer: str) -> bool | None:
        return parse_verdict(answer)


class Reask(AskingCheck):
    """The query asked again at REASK_TEMPERATURE (one sample, the live answers' system prompt
    and length), its answer judged against the cached entry's by meaning (AnswerJudge: the
    answer bar and the number guard): one backend request per query judged."""

    def __init__(
        self,
        answers: BackendAnswers,
        embedder: Embedder,
        live: Sequence[str],
        live_v: Vector,
        judge: AnswerJudge | None = None,
    ) -> None:
        super().__init__(answers)
        self.embedder, self.live, self.live_v = embedder, live, live_v
        self.answer_judge = judge or AnswerJudge()
        self._vecs: dict[str, Vector] = {}

    @staticmethod
    def params(live: AskParams) -> AskParams:
        return AskParams(
            live.model, system=live.system, max_tokens=live.max_tokens,
            temperature=REASK_TEMPERATURE, reask=False,
        )  # fmt: skip

    def prompt_of(self, query: str, entry: int) -> str:
        return query

    def judge(self, query: str, entry: int, answer: str) -> bool | None:
        if answer not in self._vecs:
            self.arrived({query: answer})
        v = self._vecs[answer]
        return self.answer_judge.judge(v, self.live_v[entry], answer, self.live[entry]).same

    def arrived(self, got: dict[str, str]) -> None:
        fresh = [t for t in dict.fromkeys(got.values()) if t not in self._vecs]
        if fresh:  # one batch, as the protocol embeds answers
            self._vecs.update(zip(fresh, self.embedder.embed(fresh), strict=True))


class Agreement:
    """The answers the cache already holds, as the shipped matcher's checks read them: the
    query's live answer against the entry's (temperature 0: what the backend computed for the
    miss anyway). Never asks; its verdicts cost nothing."""

    def __init__(self, texts: Sequence[str], live: Sequence[str], live_v: Vector) -> None:
        self.at = {t: i for i, t in reversed(list(enumerate(texts)))}
        self.live, self.live_v = live, live_v
        self.judge = AnswerJudge()
        self.wanted: set[str] = set()
        self.seen: dict[tuple[str, int], bool | None] = {}
        self.tally = Tally()

    def begin(self) -> None:
        self.seen, self.tally = {}, Tally()

    def verdict(self, query: str, entry: int) -> bool | None:
        i = self.at[query]
        j = self.judge.judge(self.live_v[i], self.live_v[entry], self.live[i], self.live[entry])
        self.tally.add(j.same, True)
        self.seen[(query, entry)] = j.same
        return j.same

    def fetch(self, deadline: float | None, progress: Progress) -> int:
        return 0

    def cost(self) -> tuple[int, float]:
        return 0, 0.0


Check = AskingCheck | Agreement
