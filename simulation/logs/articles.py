"""The help center the generated logs retrieve from: articles on topics, cited by many questions.

A RAG request names the articles its retriever returned, and the cache scopes an answer by them
(the context hash, the semantic must-filter). A help center is organised by topic, not by the
question asked: one article answers many questions, and a question may retrieve two. So that no
document id, article or scope carries the question's label:
- each topic of TOPICS holds ARTICLES_PER_TOPIC articles, with opaque ids (`kb/` and 8 hex
  digits, drawn from the seed): nothing in an id names its topic, let alone a question;
- `rag_topic_share` of the topics (drawn) are in the knowledge base; the questions of the others (and
  small talk, always) retrieve nothing;
- a question of a topic in the knowledge base retrieves the topic's main article, and
  some (the log's spec says how many) one more article of the same topic, the same ones every time it is
  asked (a retriever is deterministic for a question; its paraphrases land on the same
  articles here).
So every question of a topic shares the main article with the topic's other questions, and the
doc ids split the cache by topic at most. The label stays with the scorer (`intent` column).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

import numpy as np
import orjson

ARTICLES_PER_TOPIC: Final = 3
# topic title -> CLINC150 intents whose questions it answers (an intent not listed belongs
# to "small talk", which retrieves nothing)
TOPICS: Final[dict[str, tuple[str, ...]]] = {
    "Cards": ("card_declined", "report_lost_card", "new_card", "damaged_card",
              "replacement_card_duration", "expiration_date", "pin_change",
              "international_fees"),
    "Credit and interest": ("credit_score", "improve_credit_score", "credit_limit",
                            "credit_limit_change", "apr", "interest_rate", "min_payment",
                            "application_status"),
    "Accounts and security": ("freeze_account", "account_blocked", "report_fraud", "balance",
                              "transactions", "spending_history", "routing", "order_checks"),
    "Bills and payments": ("pay_bill", "bill_balance", "bill_due", "transfer",
                           "direct_deposit", "exchange_rate"),
    "Rewards": ("rewards_balance", "redeem_rewards"),
    "Travel bookings": ("book_flight", "book_hotel", "car_rental", "flight_status",
                        "travel_suggestion", "lost_luggage", "carry_on"),
    "Travel abroad": ("international_visa", "vaccines", "plug_type", "travel_alert",
                      "travel_notification", "timezone", "translate"),
    "Dining out": ("restaurant_reviews", "restaurant_suggestion", "restaurant_reservation",
                   "confirm_reservation", "cancel_reservation", "accept_reservations",
                   "how_busy"),
    "Cooking": ("recipe", "calories", "nutrition_info", "ingredients_list",
                "ingredient_substitution", "cook_time", "food_last", "meal_suggestion"),
    "Car care": ("oil_change_when", "oil_change_how", "tire_pressure", "tire_change",
                 "jump_start", "schedule_maintenance", "last_maintenance", "mpg", "gas",
                 "gas_type"),
    "Getting around": ("traffic", "directions", "distance", "current_location", "uber",
                       "share_location"),
    "Work and pay": ("payday", "w2", "taxes", "income", "rollover_401k", "insurance",
                     "insurance_change", "schedule_meeting", "meeting_schedule"),
    "Leave and holidays": ("pto_request", "pto_balance", "pto_request_status", "pto_used",
                 "next_holiday"),
    "Planning and deliveries": ("shopping_list", "shopping_list_update", "todo_list",
                            "todo_list_update", "reminder", "reminder_update", "calendar",
                            "calendar_update", "order", "order_status"),
    "Music and home": ("next_song", "play_music", "update_playlist", "what_song",
                       "smart_home"),
    "Your assistant": ("change_ai_name", "change_user_name", "user_name", "change_language",
                       "change_accent", "change_volume", "change_speed", "reset_settings",
                       "whisper_mode", "sync_device", "find_phone", "make_call", "text",
                       "alarm", "timer"),
}  # fmt: skip
_SECOND_TITLES: Final = ("fees, limits and timing", "troubleshooting")


@dataclass(frozen=True)
class HelpCenter:
    """The articles (id -> title) and what each question retrieves (intent -> doc ids)."""

    titles: dict[str, str]
    retrieves: dict[str, tuple[str, ...]]

    def docs_json(self, intent: str) -> str:
        """The request log's `context_docs` for a question of `intent` ("[]": none)."""
        ids = self.retrieves.get(intent, ())
        return orjson.dumps([{"doc_id": d, "version": 1} for d in ids]).decode()

    def catalog(self) -> dict[str, str]:
        """doc id -> title, what a help center publishes: no question is named."""
        return dict(sorted(self.titles.items()))


def help_center(
    intents: list[str],
    rng: np.random.Generator,
    second: np.ndarray,
    rag_topic_share: float = 1 / 3,
) -> HelpCenter:
    """Draw the help center for `intents` (module docstring) from `rng`; `second[i]`: whether a
    question of intents[i] retrieves a second article (the log's own draw)."""
    titles: dict[str, str] = {}
    articles: dict[str, list[str]] = {}
    for topic in TOPICS:
        ids = []
        for k in range(ARTICLES_PER_TOPIC):
            doc = f"kb/{int(rng.integers(0, 2**32)):08x}"
            while doc in titles:  # 2^32 ids: a clash is near impossible, and never kept
                doc = f"kb/{int(rng.integers(0, 2**32)):08x}"
            titles[doc] = topic if k == 0 else f"{topic}: {_SECOND_TITLES[(k - 1) % 2]}"
            ids.append(doc)
        articles[topic] = ids
    topics = list(TOPICS)
    picked = rng.choice(len(topics), round(rag_topic_share * len(topics)), replace=False)
    in_kb = {topics[i] for i in picked.tolist()}
    topic_of = {i: t for t, members in TOPICS.items() for i in members}
    retrieves: dict[str, tuple[str, ...]] = {}
    for intent, extra in zip(intents, second.tolist(), strict=True):
        mine = topic_of.get(intent)
        if mine is None or mine not in in_kb:
            continue
        main, *others = articles[mine]
        pick = others[int(rng.integers(len(others)))]
        retrieves[intent] = (main, pick) if extra else (main,)
    return HelpCenter(titles, retrieves)
