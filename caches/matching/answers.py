"""When two answers say the same thing: their embeddings agree and no lexical guard objects.

A real backend words two answers to one question differently, so text equality means nothing
(the identical-answer table that made it mean something is gone). `AnswerJudge` compares by
meaning: the cosine of the two answers' embeddings against a bar, and the number guard of
caches/matching/lexical.py on the answer texts where both are at hand ("50 EUR" is not
"500 EUR" however close the vectors are; see ANSWER_GUARDS for why only that one).

The bar is a property of the embedder and of how the backend words things, not of a data set:
the default (0.49, all-MiniLM-L6-v2) is calibrated on CLINC150 val + oos_val with simulated
answers (evals/tune.py), as the cosine under which 1 in 200 pairs of answers to paraphrases
fall (a false "different" costs a hit, or inflates the wrong-hit bound; a false "same" hides a
wrong hit from the monitor).
Set STOKER_ANSWER_BAR for another embedder or backend; `stoker eval-semantic --data` on your
own labelled traffic prints the curve to choose it from.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np
import numpy.typing as npt

from caches.matching.lexical import GUARDS, first_violation

Vector = npt.NDArray[np.float32]
Verdict = Literal["same", "different"]
DEFAULT_ANSWER_BAR = 0.49
# Against the centroid of several answers that agreed with each other, one answer's wording
# noise averages out: same-meaning answers sit closer, and the bar can rise (calibrated as the
# pair bar, on val: 0.13% of paraphrase answers fall under it against a centroid of three).
DEFAULT_CENTROID_BAR = 0.58
# Of the prompt guards only the one that holds for answers: two answers that agree in meaning
# still state facts in their own order, with their own negations and capitalised stock phrases
# ("Glad to help."), so order, negation and entity tell a model's rewordings apart, not its
# meanings; the amounts a prompt names carry over into its answer, and must match.
ANSWER_GUARDS = {"number": GUARDS["number"]}


@dataclass(frozen=True)
class Judgement:
    verdict: Verdict
    cosine: float
    reason: str  # "cosine>=0.55", "cosine<0.55" or the guard that objected ("number", ...)

    @property
    def same(self) -> bool:
        return self.verdict == "same"


@dataclass(frozen=True)
class AnswerJudge:
    bar: float = DEFAULT_ANSWER_BAR
    centroid_bar: float = DEFAULT_CENTROID_BAR

    def __post_init__(self) -> None:
        for b in (self.bar, self.centroid_bar):
            if not -1.0 <= b <= 1.0:
                raise ValueError(f"answer bar {b} is not a cosine in [-1, 1]")

    def bar_for(self, members: int) -> float:
        return self.bar if members <= 1 else self.centroid_bar

    def agree(self, a: Vector, b: Vector, members: int = 1) -> bool:
        """Vectors only (the lookup path has no answer texts): cosine of unit vectors against
        the bar for `b`, one answer or the centroid of `members` answers."""
        return float(a @ b) >= self.bar_for(members)

    def judge(
        self, a_vec: Vector, b_vec: Vector, a_text: str, b_text: str, members: int = 1
    ) -> Judgement:
        """Full verdict on two answers (the monitor has both texts; `b_vec` may be a centroid
        of `members` agreeing answers, b_text one of them)."""
        cos = float(a_vec @ b_vec)
        guard = first_violation(a_text, b_text, ANSWER_GUARDS)
        if guard is not None:
            return Judgement("different", cos, guard)
        bar = self.bar_for(members)
        if cos >= bar:
            return Judgement("same", cos, f"cosine>={bar:.2f}")
        return Judgement("different", cos, f"cosine<{bar:.2f}")
