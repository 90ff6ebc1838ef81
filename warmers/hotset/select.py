"""Hot-set selection: what to warm for a coming window, ranked by GPU time saved, in a budget.

For each tenant and (model, template) namespace in the traffic profile:
1. cluster the complete past days into regimes (dayclusters.py); each day of the window draws
   on the past days of its regime only (weekdays on weekdays, weekends on weekends);
2. expected hits of every query those days asked ("warm a superset": the union over all
   matching days, not the top of any one day): per window hour h, the hour's mean volume on
   the matching days x the query's share of traffic around h (a Gaussian over hours of the
   day, sigma `bandwidth_h`, plus a small `background` weight for the rest of the day, so a
   query seen at 10:00 is expected a little at 11:00 too); summed over the window's hours,
   and kept per hour;
   then the live log's last `recent_hours`: a query surging there (its share several times what
   the regimes forecast) is expected at its recent share x the window's volume (spread over
   the hours as the volume is), so a trend or an incident no past day saw is warmed within
   the hour (the traffic worker writes the live hours into the profile);
3. the best candidates get their representative request and GPU cost per miss from the profile;
   uncacheable params or no representative are skipped with the reason;
4. representatives are chosen greedily by the value they serve (hits x miss cost) at the
   tenant's semantic threshold (paraphrase.py: maximum coverage, each query counted for the
   first that serves it); a cluster's value (`value_model`), "hits": the expected hits it
   adds x their GPU cost per miss - the GPU cost of the one warm send; "prevented"
   (value.py): only the first miss, which live traffic would pay before filling the entry,
   from the cluster's expected requests per window hour, each hour priced by the forecast
   load of every namespace the plan reads. Ranked past break-even (min_value_ms=None), the
   queries already served follow as exact entries, most asked first, with no expected hits
   of their own;
5. what is cached in the target namespace with more than `min_ttl_left_s` left is skipped;
   valued by "prevented", so is an entry that outlives the window, and one that expires inside
   it is valued for the hours after its expiry only (then its value is held to the bar);
Then the budget is split fairly across tenants (budget.py) and each takes its best clusters;
what a tenant cannot use goes to the best remaining clusters of any tenant. Steps 1-2 live in
forecast.py, the value a warm is priced at in value.py, when each is sent and whether it pays
in timing.py, what the cache holds as the plan asks it in freshness.py, what the plan holds in
plan.py.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable
from datetime import datetime, timedelta
from typing import Any, Literal, TypedDict, Unpack

import numpy as np
import redis

from caches import slots
from caches.boundary import redis_boundary
from caches.client import CacheClient
from caches.embedders import Embedder
from caches.embedding_cache import CachedEmbedder
from caches.keys import canonical_params, doc_floor_key, doc_gen_key, normalise_prompt
from caches.live import LiveVersions, version_for
from caches.policy import CachePolicy, request_bypass_reason
from warmers.hotset.calibration import Calibration
from warmers.hotset.forecast import Forecaster, NamespaceForecast
from warmers.hotset.freshness import CacheFreshness, Freshness
from warmers.hotset.options import HotSetConfig
from warmers.hotset.paraphrase import Cluster, TextVectors, cover_greedy
from warmers.hotset.plan import Plan, PlanItem, Skipped, WarmItem, logged_request
from warmers.hotset.renew import DocTexts, changed_docs, renewed_item
from warmers.hotset.timing import (
    SendTimes,
    ahead,
    floor_hour,
    priced,
    prices_for,
    span_start,
    with_reason,
)
from warmers.hotset.value import Prices, ValueModel, prevented
from warmers.hotset.warm_budget import Budget, fair_shares
from warmers.hotset.window import Window
from warmers.traffic.profile import MissCost, TrafficProfile


class PlanScope(TypedDict, total=False):
    """HotSetSelector.plan's keywords (what a plan is narrowed to), for a caller that passes
    them through as they come (WarmRunner.plan) without writing the list out again."""

    tenants: Iterable[str] | None
    model_id: str | None
    model_version: str | None
    value_model: ValueModel | None
    docs: Collection[tuple[str, str]] | None
    named: bool
    send_hours: tuple[datetime, datetime] | None


class HotSetSelector:
    """Reads the profile (and, for the freshness check, the cache); writes nothing. The
    profile's clock is the plan's now (an entry's expiry is now + its TTL left)."""

    def __init__(
        self,
        profile: TrafficProfile,
        embedder: Embedder | CachedEmbedder | TextVectors,
        *,
        policy: CachePolicy | None = None,
        cache_redis: redis.Redis | None = None,
        config: HotSetConfig | None = None,
        cache: CacheClient | None = None,
        calibration: Calibration | None = None,
        freshness: Freshness | None = None,
    ) -> None:
        """cache: what a warm is checked against, valued by the miss it prevents: a cluster
        whose representative a cached paraphrase already serves prevents no miss until that
        entry expires (_drop_served). Without it only the exact entry is checked.
        freshness: what the cache holds, when it is not `cache` (a replay's virtual one)."""
        self.profile = profile
        self.cache = cache
        self.vectors = embedder if isinstance(embedder, TextVectors) else TextVectors(embedder)
        self.policy = policy or CachePolicy()
        self.cache_redis = cache_redis if cache_redis is not None else profile.r
        self.cfg = config or HotSetConfig()
        self.times = SendTimes(self.cfg)  # step 4's choices: when each warm goes out, if at all
        self.freshness = freshness or CacheFreshness(self.cache_redis, cache)
        groups = self._paraphrase_groups if self.cfg.recent_paraphrase_radius else None
        self.forecaster = Forecaster(profile, self.cfg, groups)  # steps 1-2
        self.doc_texts = DocTexts(self.cache_redis)  # what renews a request whose doc changed
        # Valued by the miss prevented, each tenant's forecast rates are scaled by how the
        # landed warms' chances compared with their hits (warmers/hotset/calibration.py); None: not.
        self.calibration = calibration

    def plan(
        self,
        window: Window,
        budget: Budget,
        *,
        tenants: Iterable[str] | None = None,
        model_id: str | None = None,
        model_version: str | None = None,
        value_model: ValueModel | None = None,
        docs: Collection[tuple[str, str]] | None = None,
        named: bool = False,
        send_hours: tuple[datetime, datetime] | None = None,
    ) -> Plan:
        """The hot set for `window`. model_version: the namespace to warm (default: the version
        live for the tenant, caches/live.py; before any deploy went READY, the version each
        query was last served under, which the representative carries); value_model:
        this plan's, instead of the config's; docs: only the items whose request names one of
        these (tenant, doc id), the re-warm after a KB change (warmers/rewarm.py).

        Valued by the miss prevented, each item goes out in its cheapest hour (value.py) of
        `send_hours` (the first and last hour a send may go out in; default: from the window's
        end less the entries' TTL, or the hour under way if later, to the window's start):
        the plan's items are the ones due in the hour under way, the others wait in
        plan.deferred for a later run. named: the budget is the caller's own (a person named
        it): it is spent now on the best items, past break-even, down to those whose chance
        of being asked is under `min_p_asked`."""
        plan = Plan(window, budget, named=named, made_at=self.profile.clock())
        first, sends = self._sends(window, named, send_hours)
        plan.span_start = first
        lead = int((window.start - first).total_seconds() // 3600)
        spaces: dict[str, list[NamespaceForecast]] = {}
        for t in sorted(tenants if tenants is not None else self.profile.tenants()):
            spaces[t] = []
            for m, tv in self.profile.namespaces(t):
                if model_id is not None and m != model_id:
                    continue
                ns = self.forecaster.expected_hits(t, m, tv, window, lead, named)
                plan.regimes[f"{t}/{m}/{tv}"] = ns.note
                spaces[t].append(ns)
        plan.volume = {t: sum(ns.volume for ns in nss) for t, nss in spaces.items()}
        by_miss = (value_model or self.cfg.value_model) == "prevented"
        every = [ns for nss in spaces.values() for ns in nss]
        left = ahead(first, self._now(window), window.end)
        prices = prices_for(every, self.cfg, sends, lead, left) if by_miss else None
        ranked: dict[str, list[PlanItem]] = {}
        live: dict[str, dict[str, str]] = {}  # model -> scope -> live version, read once
        for t, nss in spaces.items():
            scale = 1.0
            if prices is not None and self.calibration is not None:
                cal = self.calibration.factor(t)
                scale, plan.calibration[t] = cal.factor, str(cal)
            items = [
                i
                for ns in nss
                for i in self._clusters(
                    ns, budget, model_version or self._live(live, t, ns.model_id), plan, prices,
                    scale,
                )
            ]  # fmt: skip
            items.sort(key=PlanItem.rank)
            items = self._renew_changed_docs(_touching(items, docs), plan)
            items = self._drop_fresh(items, plan, prices)
            if prices is not None:  # valued once the TTLs are known
                items = self._drop_served(items, plan, prices, _items(budget) + 10)
            ranked[t] = items
        if prices is not None:
            ranked = self.times.spread(ranked, plan, prices)
            ranked = {t: sorted(self.times.worth_warming(items, plan, self._now(plan.window)), key=PlanItem.rank)
                      for t, items in ranked.items()}  # fmt: skip
        self._fill(plan, ranked, plan.volume)
        return plan

    def plan_ahead(self, budget: Budget, **scope: Unpack[PlanScope]) -> Plan:
        """The scheduler's plan: the hours an entry sent now could serve (the hour under way
        and the entries' TTL after it, at most `horizon_h`), each item sent in its cheapest
        hour of them; the items due now are the plan's, the rest wait for a later run."""
        now = floor_hour(self.profile.clock())
        hours = max(1, min(self.cfg.horizon_h, math.ceil(self.policy.exact_ttl_s / 3600)))
        window = Window(now, now + timedelta(hours=hours))
        last = window.end - timedelta(hours=1)
        return self.plan(window, budget, **(scope | {"send_hours": (now, last)}))

    def _sends(
        self, window: Window, named: bool, send_hours: tuple[datetime, datetime] | None
    ) -> tuple[datetime, tuple[int, ...]]:
        """The span's first hour and the span hours a send may go out in (step 4's choice):
        an entry sent at the start of hour s lives until s + TTL, so it serves the whole
        window from s >= window end - TTL; no earlier than the hour under way, no later than
        the window's start (or the hour under way, if the window began). A named budget is
        spent now."""
        now = floor_hour(self._now(window))
        if send_hours is not None:
            first, last = (floor_hour(h) for h in send_hours)
            first, last = max(first, now), max(last, first, now)
        elif named:  # sent now, valued from the window's start (or now, if it began)
            first = last = max(now, window.start)
        else:
            ttl_h = math.floor(self.policy.exact_ttl_s / 3600)
            first = max(now, min(window.start, window.end - timedelta(hours=ttl_h)))
            last = max(first, window.start)
        start = min(first, window.start)
        to = int((first - start).total_seconds() // 3600)
        n = int((last - first).total_seconds() // 3600) + 1
        return start, tuple(range(to, to + n))

    def _now(self, window: Window) -> datetime:
        """The plan's now: the clock's, or, for a window the clock has seen end (an analysis
        of past traffic), a minute before the window: planned as it would have been then."""
        now = self.profile.clock()
        return now if now < window.end else window.start - timedelta(minutes=1)

    def _live(self, live: dict[str, dict[str, str]], tenant: str, model_id: str) -> str | None:
        """The version the gateways serve the tenant now (caches/live.py), None before any
        deploy went READY: after a deploy the profile's representatives still carry the old
        version, and a warm of it would be refused as retired."""
        if model_id not in live:
            live[model_id] = LiveVersions(self.cache_redis).get(model_id)
        return version_for(live[model_id], tenant)

    # -- steps 3-4 --

    def _clusters(
        self,
        ns: NamespaceForecast,
        budget: Budget,
        model_version: str | None,
        plan: Plan,
        prices: Prices | None,
        scale: float = 1.0,
    ) -> list[PlanItem]:
        """Step 4; valued by "prevented" (prices given), every cluster is kept, to be held to
        the bar once its TTL is known (_worth_warming), its forecast rates x `scale` (the
        tenant's calibration)."""
        top = sorted(ns.hits, key=lambda q: -ns.hits[q])[: self._candidates(budget)]
        top = [q for q in top if ns.hits[q] > 0]
        if not top:
            return []
        raw = self.profile.miss_costs(ns.tenant, ns.model_id, ns.template_version, top)
        costs, latencies = self._shrunk(raw, "gpu_ms"), self._shrunk(raw, "latency_ms")
        if prices is not None and not plan.named and self._unmerged():
            top = self.times.could_pay(ns, top, costs, latencies, prices, scale, plan)
            if not top:
                return []
        reps = self.profile.representatives(ns.tenant, ns.model_id, ns.template_version, top)
        rows: list[tuple[str, WarmItem, float]] = []  # qkey, warm item, gpu ms per miss
        for q in top:
            row = self._row(ns, q, reps.get(q), costs, model_version, plan)
            if row is not None:
                rows.append(row)
        if not rows:
            return []
        values = [ns.hits[q] * cost for q, _, cost in rows]
        clusters = self._paraphrases(ns.tenant, rows, values)
        out = []
        for c in clusters:
            members = [rows[i] for i in c.members]
            hits = sum(ns.hits[q] for q, _, _ in members)
            miss_cost = sum(ns.hits[q] * cost for q, _, cost in members) / hits
            latency = sum(ns.hits[q] * latencies[q] for q, _, _ in members) / hits
            reason = f"{ns.note}; {hits:.1f} hits x {miss_cost / 1000:.2f} s/miss"
            if len(members) > 1:
                reason += f"; serves {len(members) - 1} paraphrases"
            pi = self._item(
                ns, rows[c.rep], hits, (miss_cost, latency), reason, members, prices, scale
            )
            if (
                prices is not None
                or self.cfg.min_value_ms is None
                or pi.value_ms > self.cfg.min_value_ms
            ):
                out.append(pi)
            else:
                why = (
                    f"below break-even (saves {hits * miss_cost:.0f} GPU ms, its warm send "
                    f"costs {pi.warm_cost_ms:.0f})"
                )
                plan.skipped.append(Skipped(ns.tenant, pi.query, why, hits, pi.value_ms))
        if self.cfg.min_value_ms is None:
            # Ranked past break-even: after every query is served, the rest follow as exact
            # entries of their own, most asked first; they add no expected hits beyond the
            # representative already serving them, and their value says so.
            chosen = {c.rep for c in clusters}
            for row in (r for i, r in enumerate(rows) if i not in chosen):
                why = f"{ns.note}; already served by a paraphrase, warmed as an exact entry"
                cost = (row[2], latencies[row[0]])
                out.append(self._item(ns, row, 0.0, cost, why, [], prices))
        return out

    def _unmerged(self) -> bool:
        """Every query its own cluster (the verified matcher, no radius set)."""
        return self.cfg.cluster_threshold is None and self.cfg.matcher == "verified"

    def _paraphrase_groups(self, ns: NamespaceForecast, qkeys: list[str]) -> dict[str, int]:
        """The queries' paraphrase groups (query key -> group id): their prompts linked when
        their cosine clears `recent_paraphrase_radius`, single link. Queries without a
        representative (evicted) stand alone."""
        reps = self.profile.representatives(ns.tenant, ns.model_id, ns.template_version, qkeys)
        keys = [q for q in qkeys if reps.get(q) and reps[q].get("prompt")]
        if len(keys) < 2:
            return {}
        texts = [normalise_prompt(str(reps[q]["prompt"])) for q in keys]
        vecs = self.vectors.embed(ns.tenant, texts)
        near = (vecs @ vecs.T) >= (self.cfg.recent_paraphrase_radius or 1.0)
        group = list(range(len(keys)))

        def root(i: int) -> int:
            while group[i] != i:
                group[i] = group[group[i]]
                i = group[i]
            return i

        for i, j in zip(*np.nonzero(np.triu(near, 1)), strict=True):
            group[root(int(i))] = root(int(j))
        return {q: root(i) for i, q in enumerate(keys)}

    def _paraphrases(
        self, tenant: str, rows: list[tuple[str, WarmItem, float]], values: list[float]
    ) -> list[Cluster]:
        """Paraphrase clusters by greedy cover at the radius one entry serves; under the
        verified matcher with no radius set, every query its own (HotSetConfig.matcher), most
        valuable first."""
        thr = self.cfg.cluster_threshold
        if thr is None and self.cfg.matcher == "verified":
            order = sorted(range(len(rows)), key=lambda i: -values[i])  # stable: ties by rank
            return [Cluster(i, (i,)) for i in order if values[i] > 0]
        # normalised, as the cache client embeds it: one embedding (and cache entry) per text
        vecs = self.vectors.embed(
            tenant, [normalise_prompt(it.identity.prompt) for _, it, _ in rows]
        )
        scopes = [_scope(it) for _, it, _ in rows]
        return cover_greedy(vecs, values, thr or self.policy.threshold_for(tenant), scopes)

    def _shrunk(
        self, costs: dict[str, MissCost], what: Literal["gpu_ms", "latency_ms"]
    ) -> dict[str, float]:
        """GPU ms (or latency ms) per miss of each query, shrunk toward the namespace's mean
        by `cost_prior_misses` pseudo-misses: a query seen missing twice does not outrank the
        most asked one because its two answers ran long."""
        m = self.cfg.cost_prior_misses
        misses = sum(c.misses for c in costs.values())
        mean = sum(getattr(c, what) for c in costs.values()) / misses if misses else 0.0
        return {q: (getattr(c, what) + m * mean) / (c.misses + m) if c.misses + m else mean
                for q, c in costs.items()}  # fmt: skip

    def _item(
        self,
        ns: NamespaceForecast,
        row: tuple[str, WarmItem, float],
        hits: float,
        cost: tuple[float, float],
        reason: str,
        members: list[tuple[str, WarmItem, float]],
        prices: Prices | None = None,
        scale: float = 1.0,
    ) -> PlanItem:
        """cost: a miss's GPU ms and latency ms."""
        q, item, warm_cost = row
        miss_cost, latency = cost
        pi = PlanItem(
            ns.tenant, ns.model_id, item.identity.model_version, ns.template_version, q,
            item.identity.prompt, len(members), hits, miss_cost, warm_cost, reason, item,
            tuple(m[0] for m in members), ns.hits[q], miss_latency_ms=latency,
        )  # fmt: skip
        if prices is None:
            return pi
        rates = sum((ns.hourly(m[0]) for m in members), np.zeros(len(ns.load))) * scale
        v = prevented(
            rates, miss_cost, warm_cost, prices, self.cfg.latency_weight,
            miss_latency_ms=latency,
        )  # fmt: skip
        return priced(pi, v, tuple(float(x) for x in rates))

    def _candidates(self, budget: Budget) -> int:
        return max(self.cfg.min_candidates, int(self.cfg.candidates_per_item * _items(budget)))

    def _row(
        self,
        ns: NamespaceForecast,
        qkey: str,
        rep: dict[str, Any] | None,
        costs: dict[str, float],
        model_version: str | None,
        plan: Plan,
    ) -> tuple[str, WarmItem, float] | None:
        if rep is None or qkey not in costs:
            plan.skipped.append(
                Skipped(ns.tenant, qkey, "no representative (never reached the GPU)")
            )
            return None
        try:
            req = logged_request(
                rep | {"tenant": ns.tenant, "model_id": ns.model_id,
                       "template_version": ns.template_version},
                model_version,
            )  # fmt: skip
        except (KeyError, TypeError, ValueError) as e:
            plan.skipped.append(Skipped(ns.tenant, qkey, f"unreadable representative: {e}"))
            return None
        why = request_bypass_reason(req.params)
        if why:
            plan.skipped.append(Skipped(ns.tenant, req.prompt, f"never cacheable ({why})"))
            return None
        return qkey, WarmItem.of(req), costs[qkey]

    # -- step 5 and the budget --

    def _renew_changed_docs(self, items: list[PlanItem], plan: Plan) -> list[PlanItem]:
        """Logged requests whose documents changed since they were logged inline the old
        text, and a key naming the doc by id alone could not tell a stale warm from a fresh
        one; a versioned doc under its floor would be refused at the write. Each is renewed
        with the doc's new text (warmers/hotset/renew.py: what a KB change of schema v2 carried)
        where the body holds an old one, else dropped with the reason (one MGET, and one
        more for the texts when something changed)."""
        docs = sorted({(i.tenant, d.doc_id) for i in items if i.item.request.body is not None
                       for d in i.item.request.docs})  # fmt: skip
        if not docs:
            return items
        with redis_boundary("hot set doc generations"):
            # Tenants' keys lie in different slots: one MGET per slot on a cluster.
            now = slots.mget(
                self.cache_redis,
                [doc_gen_key(t, d) for t, d in docs] + [doc_floor_key(t, d) for t, d in docs],
            )
        gens = {doc: int(g or 0) for doc, g in zip(docs, now[: len(docs)], strict=True)}
        floors = {doc: int(f or 0) for doc, f in zip(docs, now[len(docs) :], strict=True)}
        changed = {id(i): ds for i in items if (ds := changed_docs(i, gens, floors))}
        if not changed:
            return items
        texts = self.doc_texts.read({(i.tenant, d) for i in items for d in changed.get(id(i), ())})
        out = []
        for i in items:
            if id(i) not in changed:
                out.append(i)
                continue
            renewed, why = renewed_item(i, changed[id(i)], texts, gens, floors)
            if renewed is None:
                plan.skipped.append(Skipped(i.tenant, i.query, why))
            else:
                out.append(renewed)
        return out

    def _drop_fresh(
        self, items: list[PlanItem], plan: Plan, prices: Prices | None
    ) -> list[PlanItem]:
        """Drop what is cached with enough TTL left (one pipelined PTTL). Priced (valued by the
        miss it prevents), what outlives the window; what expires inside the span is valued
        for the hours after its expiry only (a refresh ahead: it goes out before the expiry if
        that is its cheapest hour). By hits, what has more than `min_ttl_left_s` left."""
        if not items:
            return items
        ttls = self.freshness.ttl_left_ms([i.item.identity.key().exact() for i in items])
        keep = []
        bar_ms = self.cfg.min_ttl_left_s * 1000
        now, w = self.profile.clock(), plan.window
        for i, pttl in zip(items, ttls, strict=True):
            expires = now + timedelta(milliseconds=pttl) if pttl >= 0 else None  # -2: absent
            outlives = expires is not None and expires >= w.end
            fresh = outlives if prices is not None else pttl > bar_ms
            if pttl == -1 or fresh:
                left = "no expiry" if pttl == -1 else f"{pttl / 1000:.0f} s left"
                plan.skipped.append(Skipped(i.tenant, i.query, f"cached ({left})"))
                plan.fresh.append(i)
            elif prices is not None and expires is not None and expires > span_start(plan):
                keep.append(self.times.valued_after(i, expires, plan, prices, "cached"))
            else:
                keep.append(i)
        return keep

    def _drop_served(
        self, items: list[PlanItem], plan: Plan, prices: Prices, limit: float
    ) -> list[PlanItem]:
        """Valued by the miss it prevents, a cluster whose representative the cache already
        serves through another entry (a paraphrase live traffic cached first) prevents no
        miss while that entry lives: left out if the entry outlives the window, valued for
        the hours after its expiry if not. One semantic lookup per item, the best `limit`
        only (ranked lower, the budget rarely reaches them)."""
        if not self.freshness.serves_paraphrases or not items:
            return items
        keep: list[PlanItem] = []
        now, w = self.profile.clock(), plan.window
        for n, i in enumerate(items):
            if n >= limit:
                keep.extend(items[n:])
                break
            key = self.freshness.serving_key(i.item.identity)
            if key is None or key == i.item.identity.key().exact():
                keep.append(i)  # a miss, or its own entry (_drop_fresh valued it)
                continue
            pttl = self.freshness.ttl_left_ms([key])[0]
            expires = now + timedelta(milliseconds=pttl) if pttl >= 0 else None
            if pttl == -1 or (expires is not None and expires >= w.end):
                left = "no expiry" if expires is None else f"{pttl / 1000:.0f} s left"
                why = f"served by a cached paraphrase ({left})"
                plan.skipped.append(Skipped(i.tenant, i.query, why))
                plan.fresh.append(i)
            elif expires is None:  # expired between the lookup and the PTTL: a miss
                keep.append(i)
            else:
                keep.append(
                    self.times.valued_after(
                        i, expires, plan, prices, "served by a cached paraphrase"
                    )
                )
        return sorted(keep, key=PlanItem.rank)

    def _fill(
        self, plan: Plan, ranked: dict[str, list[PlanItem]], volume: dict[str, float]
    ) -> None:
        b = plan.budget
        demands = {t: sum(b.cost(i.warm_cost_ms) for i in items) for t, items in ranked.items()}
        plan.shares = fair_shares(b.total, demands, volume, self.cfg.fairness_floor)
        left: list[PlanItem] = []
        spent = 0.0
        for t, items in ranked.items():
            mine = 0.0
            for i in items:
                c = b.cost(i.warm_cost_ms)
                if mine + c <= plan.shares[t] + 1e-9:
                    mine += c
                    plan.items.append(i)
                else:
                    left.append(i)
            spent += mine
        # Shares are fractional and GPU costs lumpy: what no share could hold goes, best first,
        # to whatever still fits in the whole budget.
        for i in sorted(left, key=PlanItem.rank):
            c = b.cost(i.warm_cost_ms)
            if spent + c <= b.total + 1e-9:
                spent += c
                plan.items.append(with_reason(i, "; from leftover budget"))
            else:
                plan.over_budget += 1
                why = f"left out by the budget ({b} spent)"
                plan.skipped.append(Skipped(i.tenant, i.query, why, i.expected_hits, i.value_ms))
        plan.items.sort(key=PlanItem.rank)


def _items(budget: Budget) -> float:
    """How many items the budget buys; GPU budgets guess 0.5 s an item (decode-heavy answers)."""
    if budget.requests is not None:
        return float(budget.requests)
    return (budget.gpu_seconds or 0.0) / 0.5


def _touching(items: list[PlanItem], docs: Collection[tuple[str, str]] | None) -> list[PlanItem]:
    """The items whose request names one of `docs` (tenant, doc id); all when None."""
    if docs is None:
        return items
    return [i for i in items if any((i.tenant, d.doc_id) in docs for d in i.item.request.docs)]


def _scope(item: WarmItem) -> tuple[str, tuple[tuple[str, int], ...]]:
    """What a semantic hit must share with the entry: params and retrieved docs (and versions,
    where the retriever knows them; -1 stands for none)."""
    r = item.identity
    return canonical_params(r.params.as_dict()), tuple(
        sorted((d.doc_id, -1 if d.version is None else d.version) for d in r.docs)
    )
