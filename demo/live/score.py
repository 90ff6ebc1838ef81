"""The live demo's scorer: whether a served hit crossed tenants, was stale, or came from the
retired model, judged by the text it served and when, never by the key scheme.

The real model cites nothing, so a served text is traced back through the ledger
(demo.live.ledger): every answer the model wrote, for which tenant, from which article
revisions, by which server process, and when. Only answers a cache could hold count as sources
(whole, status 200, from the gateway's misses or a warm), written before the hit was served.
For a hit of tenant T serving text X at time t, with S the sources of X:
- unattributed: S is empty (no answer the model wrote is this text: the relay missed one, or
  the cache served something no model wrote);
- crossed: no source is T's (the text was only ever written for other tenants);
- mixed: some sources are T's and some another tenant's. A short generic answer ("I'm sorry
  for any confusion") is written for many tenants; serving it to T leaks nothing T's own
  requests did not get, so it is not counted crossed, and is counted apart;
- stale: every one of T's sources read an article revision that a knowledge-base change had
  replaced by t; `stale_ambiguous`: some did and some did not (the same text came from the old
  and the new revision: the change did not change this answer), not counted stale;
- retired: t is past the cutover and every one of T's sources came from a server process of
  the retired version; `retired_ambiguous` when the new version's wrote it too (same weights
  here, so a text both wrote is the same answer either way), not counted.
mixed, stale_ambiguous and retired_ambiguous are three checks' verdicts, not one partition: a
hit may be ambiguous for several, so `ambiguous` counts each hit that is for any, once.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field

from demo.live.ledger import Generation

# Who writes answers a cache may hold: the prefix warm (one token) and the probes (never
# stored) are not sources of a served text.
ANSWER_SOURCES = frozenset({"live", "warm", "deploy", "rewarm"})


@dataclass(frozen=True)
class ServedHit:
    tenant: str
    text: str
    at: float  # time.time() when the hit was served
    outcome: str = "exact"  # or "semantic"


@dataclass(frozen=True)
class Replacement:
    """Revision `revision` of a tenant's article stopped being current at `at` (the instant
    its knowledge-base change was published: the retriever returns the next one after)."""

    tenant: str
    doc_id: str
    revision: int
    at: float


@dataclass(frozen=True)
class Cutover:
    """The new version went live at `at`; `old_servers` are the server processes (the ledger's
    `server` numbers) that ran the retired one."""

    at: float
    old_servers: frozenset[int]


@dataclass(frozen=True)
class Verdict:
    unattributed: bool = False
    crossed: bool = False
    mixed: bool = False
    stale: bool = False
    stale_ambiguous: bool = False
    retired: bool = False
    retired_ambiguous: bool = False

    @property
    def ambiguous(self) -> bool:
        """Ambiguous for at least one check: the three kinds are one check's each, and one
        hit may be all three (a generic answer written for two tenants by both servers)."""
        return self.mixed or self.stale_ambiguous or self.retired_ambiguous


@dataclass
class Tally:
    """Verdicts counted; `examples` keeps the first few texts of each wrong kind."""

    hits: int = 0
    counts: Counter[str] = field(default_factory=Counter)
    examples: dict[str, list[str]] = field(default_factory=dict)

    def add(self, hit: ServedHit, v: Verdict) -> None:
        self.hits += 1
        self.counts["ambiguous"] += v.ambiguous
        for name in Verdict.__dataclass_fields__:
            if getattr(v, name):
                self.counts[name] += 1
                if name in ("crossed", "stale", "retired", "unattributed"):
                    seen = self.examples.setdefault(name, [])
                    if len(seen) < 3:
                        seen.append(f"{hit.tenant}: {hit.text[:120]}")

    def as_dict(self) -> dict[str, object]:
        names = [*Verdict.__dataclass_fields__, "ambiguous"]
        return {"hits": self.hits, **{n: self.counts[n] for n in names}, "examples": self.examples}


class Attributor:
    """Judges served hits against the ledger's generations (module docstring)."""

    def __init__(
        self,
        generations: Iterable[Generation],
        replacements: Iterable[Replacement] = (),
        cutover: Cutover | None = None,
    ) -> None:
        self.by_text: dict[str, list[Generation]] = defaultdict(list)
        for g in generations:
            if g.source in ANSWER_SOURCES and g.storable:
                self.by_text[g.text].append(g)
        self.replaced: dict[tuple[str, str, int], float] = {}
        for r in replacements:
            key = (r.tenant, r.doc_id, r.revision)
            self.replaced[key] = min(r.at, self.replaced.get(key, r.at))
        self.cutover = cutover

    def sources(self, hit: ServedHit) -> list[Generation]:
        """The answers the model wrote with this text before the hit was served."""
        return [g for g in self.by_text.get(hit.text, ()) if g.ended <= hit.at]

    def judge(self, hit: ServedHit) -> Verdict:
        gens = self.sources(hit)
        if not gens:
            return Verdict(unattributed=True)
        own = [g for g in gens if g.tenant == hit.tenant]
        if not own:
            return Verdict(crossed=True)
        stale = [self.stale_at(g, hit.at) for g in own]
        retired = [self.retired_at(g, hit.at) for g in own]
        return Verdict(
            mixed=len(own) < len(gens),
            stale=all(stale),
            stale_ambiguous=any(stale) and not all(stale),
            retired=all(retired),
            retired_ambiguous=any(retired) and not all(retired),
        )

    def stale_at(self, g: Generation, t: float) -> bool:
        """Whether g read an article revision replaced at or before t."""
        for doc_id, revision in g.docs:
            at = self.replaced.get((g.tenant or "", doc_id, revision))
            if at is not None and at <= t:
                return True
        return False

    def retired_at(self, g: Generation, t: float) -> bool:
        c = self.cutover
        return c is not None and t >= c.at and g.server in c.old_servers

    def tally(self, hits: Iterable[ServedHit]) -> Tally:
        out = Tally()
        for h in hits:
            out.add(h, self.judge(h))
        return out
