"""How the simulated backend words an answer: like a model, not like a lookup table.

An answer is made of what a model's answer is made of:
- the facts of what the question means: six content words drawn from the question's meaning
  (SimConfig.meanings maps a prompt to a meaning id; without one, the prompt is its own
  meaning), stated and then restated, so paraphrases of one question agree in meaning and
  other questions do not;
- one content word of the question itself, restated as models do ("about montpelier"): the
  answers to two look-alike questions share it, the answers to two paraphrases may not;
- the prompt's specifics, carried over as a model repeats them: amounts, currencies, dates,
  names and "from X to Y" directions ("transfer 50 EUR" and "transfer 500 EUR" differ);
- wording: an opener, filler, connectors, an order of facts and stock phrases ("you can check it
  in the app"), chosen at random from phrases every question shares (boilerplate), so two
  answers never match by their text alone.
The random choices are seeded by the prompt (the same prompt is answered the same way) unless
the simulator varies its wording on every call, as sampling would.

How alike that makes answers, by all-MiniLM-L6-v2 cosine, on CLINC150 with vary_wording
(tests/warmers/test_phrasing.py keeps the ordering): answers to paraphrases agree more than
the answers to the nearest look-alike question of another intent, with an overlap of about
2% at the best single bar. A real model's answers may overlap more or less; eval-semantic on
your own backend's answers is the measure that counts.
"""

from __future__ import annotations

import hashlib
import random
import re
from collections.abc import Sequence

# Content words a meaning's facts are drawn from: everyday support vocabulary, so answers read
# like answers and two meanings rarely share more than a word or two.
_FACT_WORDS = (
    "account", "balance", "card", "payment", "transfer", "limit", "statement", "bill",
    "refund", "order", "parcel", "delivery", "address", "password", "login", "profile",
    "settings", "security", "device", "phone", "app", "email", "reminder", "alarm", "timer",
    "calendar", "meeting", "flight", "hotel", "booking", "seat", "luggage", "visa", "passport",
    "insurance", "claim", "policy", "loan", "mortgage", "rate", "interest", "deposit",
    "savings", "budget", "expense", "receipt", "invoice", "tax", "recipe", "ingredient",
    "oven", "timer", "meal", "calories", "nutrition", "weather", "forecast", "temperature",
    "rain", "traffic", "route", "distance", "fuel", "oil", "tire", "engine", "battery",
    "service", "appointment", "doctor", "pharmacy", "prescription", "symptom", "exercise",
    "sleep", "music", "playlist", "volume", "speaker", "light", "thermostat", "language",
    "translation", "dictionary", "spelling", "grammar", "definition", "history", "fact",
    "news", "score", "game", "team", "schedule", "ticket", "concert", "movie", "restaurant",
    "reservation", "menu", "tip", "currency", "exchange", "conversion", "unit", "measurement",
    "shopping", "list", "cart", "coupon", "discount", "warranty", "repair", "return",
    "subscription", "plan", "upgrade", "support", "agent", "chat", "message", "voicemail",
    "contact", "number", "network", "wifi", "password", "router", "update", "backup",
    "storage", "photo", "file", "folder", "printer", "scanner",
)  # fmt: skip
_FACTS: tuple[str, ...] = tuple(dict.fromkeys(_FACT_WORDS))  # each word once
_OPENERS = (
    "Sure.", "Of course.", "Happy to help.", "Here is what I found.", "Good question.",
    "Thanks for asking.", "Right away.", "Certainly.", "Let me explain.", "Okay.",
)  # fmt: skip
_CLOSERS = (
    "Anything else?", "Hope that helps.", "Let me know if you need more.", "Glad to help.",
    "Just ask if something is unclear.", "", "",
)  # fmt: skip
_STOCK = (
    "you can check it in the app", "this usually takes a moment", "see the settings page",
    "it depends on your region", "the details are on the website", "ask support if unsure",
    "keep a note of it", "this is the usual way", "it may change over time",
)  # fmt: skip
_CONNECTORS = ("then", "and", "also", "next", "after that", "plus")
_FILLER = ("basically", "simply", "usually", "in short", "normally", "just")

_NUMBER = re.compile(r"[$€£]?\d+(?:[.,]\d+)*%?")
_CURRENCY = re.compile(r"\b(?:usd|eur|gbp|jpy|inr|cad|aud|dollars?|euros?|pounds?|yen|rupees?)\b")
_DATE = re.compile(
    r"\b(?:today|tomorrow|yesterday|monday|tuesday|wednesday|thursday|friday|saturday|sunday|"
    r"january|february|march|april|may|june|july|august|september|october|november|december)\b"
)
_DIRECTION = re.compile(r"\b(?:from|to|into)\s+([a-z][\w-]*)")


def _words(text: str) -> frozenset[str]:
    return frozenset(text.split())


_WORD = re.compile(r"[a-z][a-z']*")
_STOP = _words(
    "the a an is are was were be been am i me my you your it its this that these those of in "
    "on for and or with by at as what how do does did can could would should will please tell "
    "want need know get much many there here have has had some any from into about which who "
    "when where why just like make let"
)
_NAME = re.compile(r"(?<![.!?]\s)(?<!^)\b[A-Z][a-z]{2,}\b")


def facts_of(meaning: str, n: int = 6) -> list[str]:
    """The content words of a meaning: deterministic, distinct."""
    rng = random.Random(hashlib.sha256(meaning.encode()).digest())
    return rng.sample(_FACTS, n)


def specifics_of(prompt: str) -> list[str]:
    """What a model repeats of the question: amounts, currencies, dates, directions, names."""
    low = prompt.lower()
    out = [m.group(0) for m in _NUMBER.finditer(low)]
    out += [m.group(0) for m in _CURRENCY.finditer(low)]
    out += [m.group(0) for m in _DATE.finditer(low)]
    out += [f"{m.group(0).split()[0]} {m.group(1)}" for m in _DIRECTION.finditer(low)]
    out += [m.group(0) for m in _NAME.finditer(prompt)]
    return list(dict.fromkeys(out))  # each once, in order


def render(meaning: str, prompt: str, rng: random.Random, length: int = 0) -> list[str]:
    """The answer's words (citations excluded: the simulator puts them first), at least
    `length` of them: a longer answer restates the meaning's facts with stock phrases."""
    facts = facts_of(meaning)
    rng.shuffle(facts)  # a model says the same things in its own order
    words: list[str] = rng.choice(_OPENERS).split()
    echo = echoed(prompt, rng)
    if echo:
        words += ["about", *echo]
    if rng.random() < 0.5:
        words.append(rng.choice(_FILLER))
    for k, fact in enumerate(facts):
        if k and rng.random() < 0.4:
            words += rng.choice(_CONNECTORS).split()
        words.append(fact)
    specifics = specifics_of(prompt)
    if specifics:
        words += ["for", *_join(specifics)]
    words += rng.choice(_CLOSERS).split()
    while len(words) < length:
        words += ["also", *rng.sample(facts, 2), *rng.choice(_STOCK).split()]
    return words


def echoed(prompt: str, rng: random.Random, n: int = 1) -> list[str]:
    """Up to n content words of the question, in its order."""
    content = list(dict.fromkeys(w for w in _WORD.findall(prompt.lower()) if w not in _STOP))
    content = [w for w in content if len(w) > 2]
    if len(content) <= n:
        return content
    return [content[i] for i in sorted(rng.sample(range(len(content)), n))]


def _join(parts: Sequence[str]) -> list[str]:
    return [w for p in parts for w in p.split()]
