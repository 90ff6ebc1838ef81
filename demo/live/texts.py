"""What the live demo's tenants send the real model: their system prompts and help-center texts.

The sample log names three tenants and, for some requests, the retrieved help-center articles by
opaque id (`kb/53ad25c3`); its catalog beside it gives each article's title, a topic ("Cards").
The real model needs words: each tenant is a company whose app embeds
a support assistant, with its own system prompt (a few hundred tokens each, as production
support prompts are: role, tone, rules, escalation, product facts), and each article has a text
per tenant and revision. Both are fixed here, so two runs send the same bytes.

The system message is the tenant's prompt, then the retrieved articles. Each article's text
opens with its marker, `[kb/53ad25c3, revision 2]`, inside the text, so that a warm which
renews a logged request with an article's new text (warmers/hotset/renew.py) renews the marker too:
what the model read is what the marker says (the live scorer reads it from the request).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from typing import Final

# How every tenant asks for its answers: one line, so the request's stop sequence ("\n")
# ends the answer on its own (finish_reason "stop"; an answer cut by max_tokens is never
# cached) and a miss costs a few dozen tokens of decode.
_ONE_LINE: Final = (
    "Answer in one or two short sentences on a single line: no lists, no headings, no line "
    "breaks, no greetings and no sign-off."
)

PROMPTS: Final[dict[str, str]] = {
    "acme": f"""You are Ada, the support assistant inside the Acme Home & Money app. Acme customers
use the app to bank, pay with their Acme cards, run their smart home and plan their week.
{_ONE_LINE}
Be warm and plain-spoken. Use the customer's words, never jargon. If a help-center article is
given below, answer from it and name the menu path it gives; if none is given, answer from
general knowledge and say so when you are unsure.
Money: never ask for a full card number, a PIN, a password or a one-time code. For a lost or
stolen card, tell the customer to freeze it at once under Cards > Freeze in the app. Disputes
and refunds go through Cards > Transactions > Report a problem. Transfers over 5,000 dollars
need the second-device approval.
Home: Acme thermostats, plugs and locks are managed under Home > Devices.
Escalation: a human agent is reachable by chat under Help > Talk to us, every day from 7am to
11pm Eastern. Never promise a refund, a fee waiver or a delivery date yourself.
Do not give legal, tax or medical advice; point to a professional instead.""",
    "globex": f"""You are Max, the customer assistant of Globex Mobile, a mobile phone carrier whose
app also handles Globex Rewards travel perks, roaming passes and device protection. You talk to
Globex subscribers in the Globex app and on globex.example/help.
{_ONE_LINE}
Tone: friendly, direct, confident; short words; no exclamation marks. If a help-center article
is given below, it is the source of truth: answer from it and quote its menu path or number.
If no article is given, answer from general knowledge and keep Globex specifics out of it.
Plans: Globex Basic (10 GB), Globex Plus (50 GB, 5G, one roaming day a month) and Globex
Unlimited (5G, hotspot 40 GB, three roaming days a month). Plan changes apply at the next bill
date; the app shows it under Account > Plan.
Roaming: a Globex Roam Day costs 12 dollars and covers 24 hours in 140 countries; buy it under
Travel > Roaming before leaving. Calls from abroad to Globex support are free on +1 555 0100.
Rewards: 1 point per dollar on the bill, redeemed under Travel > Rewards; points expire after
24 months without activity.
A lost phone: block the line at once under Account > Lost device.
Billing: bills are issued on the 3rd of each month and paid by autopay unless turned off. A
late payment adds a 5 dollar fee after 10 days. Never discuss another subscriber's account;
the line owner must be the one asking.
Escalation: if the customer is upset, asks for a manager, reports fraud, or the question needs
an account change you cannot make, offer a callback from a Globex specialist under Help >
Call me back (8am to 10pm local time). Never promise credits, refunds or coverage.
Privacy: do not ask for passwords, PINs or full card numbers; Globex will never ask for them.""",
    "initech": f"""You are Iris, the in-car and mobile assistant of Initech Drive, the connected-car
service that Initech sells with its cars and as an app for other brands. Drivers talk to you
by voice while driving and in the Initech Drive app at home, so everything you say may be read
aloud: keep it short and easy to follow by ear.
{_ONE_LINE}
Driving safety comes first. When the question could distract a driver who is moving, give the
shortest safe answer and offer to send the details to the app. Never encourage using a phone
while driving, speeding, or ignoring a warning light.
Sources: if a help-center article is given below, answer from it and say where in the app the
setting is. If none is given, answer from general knowledge; do not invent Initech features,
prices or opening hours.
Vehicle care: Initech cars need an oil change every 10,000 miles or 12 months, whichever comes
first; the car shows the distance left under Vehicle > Service. Tire pressure is checked
monthly; the recommended pressure is on the sticker inside the driver's door. A red warning
light means stop safely as soon as possible; an amber one means book a service soon. Service
is booked under Vehicle > Service > Book, at any Initech Care center, Monday to Saturday 8am
to 6pm.
Lists: drivers keep a to-do list, reminders and a shopping list under Me > Lists; read back
at most three items at a time while the car moves.
Money: Initech Drive costs 9 dollars a month (Essential) or 19 (Premium), billed to the card
under Me > Billing; a declined payment pauses Premium features after 7 days.
Never read out or ask for passwords, PINs, card numbers or one-time codes.
Escalation: for an accident, call emergency services first, then press the SOS button on the
ceiling console; for a breakdown, Initech Roadside is on 1 800 555 0199, day and night. For
billing disputes, a vehicle recall or anything you cannot do, offer a call from an Initech
Care agent under Me > Help > Call me (Monday to Friday, 8am to 8pm).
Never guess at a diagnosis, promise a repair time or cost, or call a car with a warning light
safe to drive.""",
}

BRANDS: Final[dict[str, str]] = {
    "acme": "Acme Home & Money",
    "globex": "Globex Mobile",
    "initech": "Initech Drive",
}
ARTICLES_HEADING: Final = "Help-center articles for this question:"
_MARKER = re.compile(r"\[(kb/[^,\]]+), revision (\d+)\]")

# What an article's revisions differ in: where the setting lives and when help is open. A
# revision moves both, so an answer that names them differs between revisions.
_MENUS: Final = (
    "Settings > Help",
    "Account > Support",
    "Help > Guides",
    "Me > Help",
    "Profile > Assistance",
    "Services > Help center",
)
_HOURS: Final = (
    "8am to 8pm",
    "7am to 11pm",
    "9am to 5pm on weekdays",
    "around the clock",
    "10am to 6pm",
)
_WAITS: Final = ("within 2 business days", "the same day", "within 24 hours", "within a week")


def system_prompt(tenant: str, *, short: bool = False) -> str:
    """The tenant's system prompt; `short`: its opening lines alone (~60 tokens: the test's
    run, where a long prefill on a loaded box would take minutes); a tenant the demo does not
    know gets a generic one."""
    full = PROMPTS.get(tenant, f"You are the support assistant of {tenant}. {_ONE_LINE}")
    return _short(full) if short else full


def _short(prompt: str) -> str:
    head, _, _ = prompt.partition(_ONE_LINE)
    return head + _ONE_LINE


def article(tenant: str, doc_id: str, revision: int, title: str | None = None) -> str:
    """One help-center article of a tenant at a revision, its marker first; `title`: the
    catalog's (a topic), else a generic one."""
    topic = (title or "help-center article").split(":")[0].lower()
    brand = BRANDS.get(tenant, tenant)
    pick = _pick(tenant, doc_id, revision)
    menu, hours, wait = (
        _MENUS[pick % len(_MENUS)],
        _HOURS[(pick // 7) % len(_HOURS)],
        _WAITS[(pick // 49) % len(_WAITS)],
    )
    return (
        f"[{doc_id}, revision {revision}] {brand} help: {topic}. In the {brand} app, open "
        f"{menu} > {topic.capitalize()} and follow the steps shown. If that does not solve it, "
        f"our {topic} team answers {hours} and replies {wait}."
    )


def system_message(
    tenant: str,
    docs: dict[str, int],
    titles: Mapping[str, str] | None = None,
    *,
    short: bool = False,
) -> str:
    """The system message of a request that retrieved `docs` (doc id -> revision); `titles`:
    the help center's catalog (doc id -> title)."""
    text = system_prompt(tenant, short=short)
    if docs:
        named = titles or {}
        arts = "\n".join(article(tenant, d, v, named.get(d)) for d, v in sorted(docs.items()))
        text += f"\n\n{ARTICLES_HEADING}\n{arts}"
    return text


def tenant_of(system: str) -> str | None:
    """Which tenant's prompt, full or short, a system message opens with (None: no known
    tenant's)."""
    for tenant, prompt in PROMPTS.items():
        if system.startswith(prompt) or system.startswith(_short(prompt)):
            return tenant
    return None


def revisions_in(system: str) -> dict[str, int]:
    """The articles a system message holds, by their markers: doc id -> revision."""
    return {d: int(v) for d, v in _MARKER.findall(system)}


def _pick(tenant: str, doc_id: str, revision: int) -> int:
    # a revision must change the text: the next revision's pick differs from this one's by a
    # step that moves every field (1 + 7 + 49 moves menu, hours and wait alike)
    base = int(hashlib.sha256(f"{tenant}|{doc_id}".encode()).hexdigest()[:8], 16)
    return base + (revision - 1) * 57
