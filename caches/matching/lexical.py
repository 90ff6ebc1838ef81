"""Lexical guards: differences a sentence embedding cannot see (numbers, negation, order).

all-MiniLM-L6-v2 puts "convert celsius to fahrenheit" and "convert fahrenheit to celsius" at
cosine 0.995, "transfer $50" and "transfer $500" above 0.95, and "i can pay" next to "i can't
pay". Each guard looks for one such difference between the query and a cached prompt and names
it; any guard firing vetoes the candidate. On CLINC150 (where wrong hits are mostly different
intents in one domain, not flipped details) the guards barely move the wrong share: they exist
for the cases a cosine gets reliably wrong, and for conservative routes.
"""

from __future__ import annotations

import re
from collections.abc import Callable

_TOKEN = re.compile(r"[a-z0-9$%.,']+")
_NUMBER = re.compile(r"\d")


def _words(text: str) -> frozenset[str]:
    return frozenset(text.split())


_NEGATIONS = _words(
    "not no never nor without cannot can't don't doesn't didn't isn't aren't wasn't weren't "
    "won't wouldn't shouldn't couldn't haven't hasn't hadn't dont doesnt didnt isnt cant wont"
)
# Words that make the order of the other words matter: "a to b" is not "b to a".
_DIRECTION = _words("to from into than vs versus before after over under onto")
_STOP = _words(
    "a an the is are was were be been am i me my you your it its this that these those of in on "
    "for and or with by at as what how do does did can could would should will please tell "
    "want need know get much many"
)

Guard = Callable[[list[str], list[str]], bool]


def tokens(text: str) -> list[str]:
    return [t.strip(".,") for t in _TOKEN.findall(text.lower()) if t.strip(".,")]


def numbers_differ(a: list[str], b: list[str]) -> bool:
    """Both mention numbers and not the same ones ("$50" vs "$500", "room 12" vs "room 21")."""
    na = {t for t in a if _NUMBER.search(t)}
    nb = {t for t in b if _NUMBER.search(t)}
    return bool(na) and bool(nb) and na != nb


def negation_differs(a: list[str], b: list[str]) -> bool:
    """One is negated and the other is not ("can i pay" vs "can't i pay")."""
    return bool(_NEGATIONS.intersection(a)) != bool(_NEGATIONS.intersection(b))


def order_differs(a: list[str], b: list[str]) -> bool:
    """Both carry a direction word and the content words they share come in another order
    ("celsius to fahrenheit" vs "fahrenheit to celsius"). Needs two shared content words."""
    if not (_DIRECTION.intersection(a) and _DIRECTION.intersection(b)):
        return False
    sa, sb = set(a), set(b)
    shared_a = _dedup([t for t in a if t in sb and t not in _STOP and t not in _DIRECTION])
    shared_b = _dedup([t for t in b if t in sa and t not in _STOP and t not in _DIRECTION])
    return len(shared_a) >= 2 and shared_a != shared_b


def _dedup(seq: list[str]) -> list[str]:
    return list(dict.fromkeys(seq))


GUARDS: dict[str, Guard] = {
    "number": numbers_differ,
    "negation": negation_differs,
    "order": order_differs,
}


def first_violation(query: str, cached: str, guards: dict[str, Guard] | None = None) -> str | None:
    """Name of the first guard that tells the two prompts apart, or None."""
    a, b = tokens(query), tokens(cached)
    for name, guard in (guards or GUARDS).items():
        if guard(a, b):
            return name
    return None
