"""The live demo's report: report.json, a readable summary, and the invariants it must keep.

Every figure here comes from the real model server (llama.cpp's llama-server serving
SmolLM2-135M-Instruct) and from what the gateway served: none rests on the simulated backend.
The plots are demo.live.plots.
"""

from __future__ import annotations

import dataclasses
import math
import textwrap
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import orjson

from demo.live.client import Probe, Served, digest_of, request_of
from demo.live.ledger import Generation
from demo.live.run import LiveResult
from demo.live.scenario import doc_ids
from demo.live.score import Attributor, ServedHit
from stoker.modelserver import DEFAULT_SERVE, MODEL_ALIAS

OUTCOMES = ("exact", "semantic", "miss", "bypass", "error")
SUMMARY_WIDTH = 80  # the summary's lines: a pipe's or a log file's width
MODEL = "SmolLM2-135M-Instruct Q4_1 on llama.cpp's llama-server"
# Who asked the model, as the ledger names its paths, in the report's words.
SOURCE_NAMES = {
    "live": "live misses (the gateway)",
    "warm": "scheduled warm",
    "deploy": "deploy pre-warm (hot set)",
    "rewarm": "re-warm after the KB change",
    "prefix": "prefix warms",
    "probe": "TTFT probes (measurement)",
}
WARMING = ("warm", "deploy", "rewarm", "prefix")
HOW_SCORED = (
    "Each hit is traced by the text it served to the answers the model wrote (the ledger relay "
    "in front of llama-server records, for every generation, the tenant whose system prompt "
    "it read, the article revisions in it, the server process and the time). crossed: the "
    "text was only ever written for other tenants. stale: every answer with this text for "
    "this tenant read an article revision that the KB change had replaced before the hit was "
    "served. Ambiguous texts are counted apart and not as wrong: 'mixed' (written for this "
    "tenant and for others too: a generic answer), 'stale_ambiguous' (written from both the "
    "old and the new revision: the change did not change it), 'retired_ambiguous' (written by "
    "the old and the new server alike). One hit may be ambiguous for several checks, so these "
    "three overlap; 'ambiguous' counts each such hit once. unattributed: no answer the model "
    "wrote has this text."
)


def percentile(xs: Sequence[float], q: float) -> float | None:
    """Nearest-rank percentile (p99 of a dozen values is their largest)."""
    if not xs:
        return None
    s = sorted(xs)
    return s[max(0, math.ceil(q * len(s)) - 1)]


def outcome_counts(served: Iterable[Served]) -> dict[str, Any]:
    c = Counter(s.outcome for s in served)
    n = sum(c.values())
    out: dict[str, Any] = {"requests": n, **{o: c.get(o, 0) for o in OUTCOMES}}
    hits = out["exact"] + out["semantic"]
    out["hit_rate"] = round(hits / n, 4) if n else 0.0
    for o in ("exact", "semantic", "miss", "bypass"):
        out[f"{o}_share"] = round(out[o] / n, 4) if n else 0.0
    return out


def hit_rates(res: LiveResult) -> dict[str, Any]:
    sc, served = res.sc, res.served
    tenants = sorted({s.tenant for s in served})
    by_hour = [outcome_counts(s for s in served if s.hour == h) | {"hour": h} for h in range(24)]

    def span(lo: int, hi: int) -> dict[str, Any]:
        return outcome_counts(s for s in served if lo <= s.hour < hi) | {"hours": f"{lo}-{hi - 1}"}

    d, k = sc.deploy_h, sc.kb_change_h
    reasons = Counter(s.reason or "-" for s in served if not s.hit)
    return {
        "day": outcome_counts(served),
        "why_not_hit": dict(reasons.most_common()),
        "per_tenant": {t: outcome_counts(s for s in served if s.tenant == t) for t in tenants},
        "by_hour": by_hour,
        "around_deploy": {"before": span(max(0, d - 3), d), "after": span(d, min(24, d + 3))},
        "around_kb_change": {"before": span(max(0, k - 3), k), "after": span(k, min(24, k + 3))},
    }


def false_semantic(res: LiveResult) -> dict[str, Any]:
    """A semantic hit is false when the served entry's question (by its key digest, mapped to
    CLINC150's label here, in the scorer only) is not of the asker's intent, or the asker's
    question is out of scope."""
    sem = [s for s in res.served if s.outcome == "semantic"]
    intents = intents_by_entry(res) if sem else {}
    false = unknown = 0
    examples: list[str] = []
    for s in sem:
        asker = str(res.traffic.day[s.index]["intent"])
        theirs = intents.get(s.key)
        if theirs is None:
            unknown += 1
        elif asker == "oos" or asker not in theirs:
            false += 1
            if len(examples) < 3:
                examples.append(
                    f"{res.traffic.day[s.index]['prompt']!r} ({asker}) got {s.text[:80]!r}"
                )
        # a semantic hit of the asker's intent is a true one
    scored = len(sem) - unknown
    return {
        "semantic_hits": len(sem),
        "semantic_hits_scored": scored,
        "false": false,
        "false_share": round(false / scored, 4) if scored else 0.0,
        "unknown_entry": unknown,
        "examples": examples,
    }


def intents_by_entry(res: LiveResult) -> dict[str, set[str]]:
    """Entry key digest -> the CLINC150 intents of the questions it answers, built here, in
    the scorer, with the gateway's own identity code; nothing that serves or warms sees it."""
    out: dict[str, set[str]] = {}
    for row in res.traffic.week1 + res.traffic.day:
        body, headers = request_of(row, res.sc, {})
        out.setdefault(digest_of(body, headers), set()).add(str(row["intent"]))
    return out


def correctness(res: LiveResult, semantic_scored: int) -> dict[str, Any]:
    """`semantic_scored`: false_semantic's count, reported with what the checks met."""
    att = Attributor(res.generations, res.replacements, res.cutover)
    hits = [ServedHit(s.tenant, s.text, s.at, s.outcome) for s in res.served if s.hit]
    tally = att.tally(hits).as_dict()
    kb_at = res.kb.get("published_at")
    applied = kb_at + res.kb.get("applied_after_ms", 0.0) / 1000 if kb_at else None
    after = [h for h in hits if applied is not None and h.at >= applied]
    tally["stale_after_invalidation_applied"] = att.tally(after).counts["stale"] if after else 0
    return tally | {"checked": checked(res, applied, semantic_scored), "how": HOW_SCORED}


def checked(res: LiveResult, kb_applied: float | None, semantic_scored: int) -> dict[str, int]:
    """What each check had to check: a check that met nothing passes vacuously. Hits served
    after the KB change's invalidation applied to requests that cite a changed article (the
    stale check), hits served after the cutover (the retired check), semantic hits scored
    against the labels (the false-hit check)."""
    changed = set(res.kb.get("docs", ()))
    cut = res.cutover.at if res.cutover is not None else None
    hits = [s for s in res.served if s.hit]
    return {
        "hits_on_changed_articles_after_kb_change": sum(
            1
            for s in hits
            if kb_applied is not None
            and s.at >= kb_applied
            and changed & set(doc_ids(res.traffic.day[s.index]))
        ),
        "hits_after_cutover": sum(1 for s in hits if cut is not None and s.at >= cut),
        "semantic_hits_scored": semantic_scored,
    }


def ttft(res: LiveResult) -> dict[str, Any]:
    def arm(probes: list[Probe]) -> dict[str, Any]:
        ms = [p.ttft_ms for p in probes if p.ttft_ms is not None]
        firsts: dict[str, float | None] = {}
        for p in probes:
            firsts.setdefault(p.tenant, _r(p.ttft_ms))
        return {
            "n": len(probes),
            "answered": len(ms),
            "first_of_each_tenant_ms": firsts,
            "p50_ms": _r(percentile(ms, 0.5)),
            "p99_ms": _r(percentile(ms, 0.99)),
            "ms": [_r(p.ttft_ms) for p in probes],
            "tenants": [p.tenant for p in probes],
        }

    cold, warm = arm(res.probes.get("cold", [])), arm(res.probes.get("prefix_warmed", []))
    out: dict[str, Any] = {"cold": cold, "prefix_warmed": warm, "prefix_warm": res.prefix_warm}
    for q in ("p50", "p99"):
        a, b = cold[f"{q}_ms"], warm[f"{q}_ms"]
        out[f"{q}_ratio"] = round(b / a, 3) if a and b is not None else None
    first = [s for s in res.served if s.hour >= res.sc.deploy_h][: res.sc.probes]
    out["live_after_cutover"] = {
        "n": len(first),
        "hits": sum(s.hit for s in first),
        "p50_ms": _r(percentile([s.ttft_ms for s in first if s.ttft_ms is not None], 0.5)),
        "p99_ms": _r(percentile([s.ttft_ms for s in first if s.ttft_ms is not None], 0.99)),
    }
    out["how"] = (
        f"The first {res.sc.probes} requests of hour {res.sc.deploy_h} (the deploy's), streamed "
        f"{res.sc.probe_concurrency} at a time straight to a freshly started llama-server, as the "
        "gateway forwards a miss; TTFT is the client's time to the first content token. "
        "'cold': the server's prompt cache empty; 'prefix_warmed': another fresh server after "
        "the prefix warm sent the tenants' hot system prompts (max_tokens 1). "
        "'live_after_cutover': the same requests later through the gateway, after the deploy's "
        "pre-warm, hits included."
    )
    return out


def backend_seconds(res: LiveResult) -> dict[str, Any]:
    by_source: dict[str, float] = dict.fromkeys(SOURCE_NAMES, 0.0)
    calls: Counter[str] = Counter()
    for g in res.generations:
        by_source[g.source] = by_source.get(g.source, 0.0) + g.backend_ms / 1000
        calls[g.source] += 1
    logged = sum(float(e.get("gpu_ms") or 0.0) for e in res.log_events) / 1000
    warming = sum(by_source[s] for s in WARMING)
    total = warming + by_source["live"]
    return {
        "server_busy_s": round(busy_seconds(res.generations), 1),
        "request_log_gpu_s": round(logged, 1),
        "request_log_events": len(res.log_events),
        "by_source_s": {s: round(by_source[s], 1) for s in SOURCE_NAMES},
        "calls": {s: calls[s] for s in SOURCE_NAMES},
        "warming_s": round(warming, 1),
        "warming_share": round(warming / total, 4) if total else 0.0,
        "how": (
            "prompt_ms + predicted_ms of llama.cpp's own timings: the request log's gpu_ms for "
            "the gateway's misses, and the ledger relay's record of every call for the warms; "
            "the warming share is the warms' seconds over the warms' and the live misses' "
            "(the TTFT probes are a measurement, left out). The server runs two requests at "
            "once and times each whole, so the sums count overlapping seconds twice: server_busy_s "
            "is the wall time it held at least one request"
        ),
    }


def busy_seconds(gens: Iterable[Generation]) -> float:
    """Wall seconds during which the server held at least one request (the union of the
    generations' spans, as the relay saw them)."""
    total, end = 0.0, float("-inf")
    for start, stop in sorted((g.started, g.ended) for g in gens):
        if start > end:
            total += stop - start
            end = stop
        elif stop > end:
            total += stop - end
            end = stop
    return total


def build_live_report(res: LiveResult) -> dict[str, Any]:
    sc, tr = res.sc, res.traffic
    fs = false_semantic(res)
    corr = correctness(res, fs["semantic_hits_scored"])
    return {
        "mode": "live",
        "simulated": False,
        "simulator_share": "none: every figure comes from the real model server",
        "backend": {
            "model": MODEL,
            "model_id": MODEL_ALIAS,
            "server_flags": (
                f"-t {DEFAULT_SERVE.threads} -np {DEFAULT_SERVE.parallel} -c {DEFAULT_SERVE.ctx} "
                f"--cache-ram {DEFAULT_SERVE.cache_ram_mib} --metrics"
            ),
            "answers": {"temperature": 0, "max_tokens": sc.max_tokens, "stop": list(sc.stop)},
        },
        "day": {
            "date": f"{tr.start:%Y-%m-%d} ({tr.start:%A})",
            "slice": (
                f"every request of {len(tr.intents)} intents, ~1 request in {sc.slice_n} "
                f"(salt {tr.salt})"
            ),
            "requests": len(tr.day),
            "full_day_requests": tr.full_day_requests,
            "repeat_share": round(tr.repeat_share, 3),
            "full_day_repeat_share": round(tr.full_day_repeat_share, 3),
            "week1_history_requests": len(tr.week1),
            "tenants": sorted({r["tenant"] for r in tr.day}),
            "system_prompt_tokens": res.prompt_tokens,
        },
        "hit_rates": hit_rates(res),
        "false_semantic_hits": fs,
        "semantic_hits_scored": fs["semantic_hits_scored"],
        "false_semantic_share": fs["false_share"],
        "correctness": corr,
        "cross_tenant_hits": corr["crossed"],
        "stale_hits": corr["stale"],
        "ttft_after_deploy": ttft(res),
        "backend_seconds": backend_seconds(res),
        "warms": res.warms,
        "deploy": {k: v for k, v in res.deploy.items() if k not in ("started_at", "ready_at")},
        "kb_change": {k: v for k, v in res.kb.items() if k != "published_at"},
        "notes": [
            "Time is compressed: the day's hours are the log's, served as fast as the model "
            "answers; TTLs (a day) do not run out within it.",
            f"The slice keeps {len(tr.intents)} intents whole, with their repeats and "
            "paraphrases; the few intents make a semantic hit across intents rarer than in "
            "the whole day, so stoker eval-semantic measures the wrong share on CLINC150.",
            "Week 1 enters the profile with the sample log's own cost figures (it was logged "
            "against another model); the day's misses add this model's timings.",
            "The rewarm worker is the production one: it plans the wall clock's hours, not "
            "the demo's day, so its re-warm after the KB change sends little; it keeps the "
            "articles' new texts, which renew what later warms replay.",
        ],
        "run": {
            "seconds": round(res.seconds, 1),
            "phases_s": res.phases,
            "load_average": res.load,
        },
    }


def verdict(report: dict[str, Any], served: int) -> list[str]:
    """The invariants the live demo promises; any broken one fails the run (exit 1)."""
    broken = []
    c = report["correctness"]
    for name in ("crossed", "unattributed", "stale_after_invalidation_applied", "retired"):
        if c[name]:
            broken.append(f"{c[name]} {name} hits")
    day = report["hit_rates"]["day"]
    if sum(day[o] for o in OUTCOMES) != day["requests"] or day["requests"] != served:
        broken.append("outcome counts do not add up to the requests served")
    if report["deploy"].get("old_version_keys_left"):
        broken.append(
            f"{report['deploy']['old_version_keys_left']} keys of the retired version left"
        )
    t = report["ttft_after_deploy"]
    if t["cold"]["p50_ms"] is None or t["prefix_warmed"]["p50_ms"] is None:
        broken.append("no TTFT figure from a probe")
    return broken


def write(report: dict[str, Any], out: Path) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    path = out / "report.json"
    path.write_bytes(orjson.dumps(report, option=orjson.OPT_INDENT_2))
    return path


def write_records(res: LiveResult, out: Path) -> None:
    """What the report was scored from, one JSON object a line: every generation the ledger
    saw (generations.jsonl) and every request as the client saw it (served.jsonl)."""
    with (out / "generations.jsonl").open("wb") as f:
        for g in res.generations:
            f.write(orjson.dumps(dataclasses.asdict(g)) + b"\n")
    with (out / "served.jsonl").open("wb") as f:
        for s in res.served:
            f.write(orjson.dumps(dataclasses.asdict(s)) + b"\n")


def summary(report: dict[str, Any]) -> str:
    """The report in words, for the console and summary.txt."""
    d, h = report["day"], report["hit_rates"]
    day, c, t, b = (
        h["day"],
        report["correctness"],
        report["ttft_after_deploy"],
        report["backend_seconds"],
    )
    fs, k = report["false_semantic_hits"], report["correctness"]["checked"]
    before, after = h["around_deploy"]["before"], h["around_deploy"]["after"]
    lines = [
        f"stoker demo (live): {MODEL}; no figure below rests on the simulator",
        f"day: {d['date']}, {d['requests']} requests of {', '.join(d['tenants'])} "
        f"({d['slice']} of {d['full_day_requests']:,}; repeats {d['repeat_share']:.0%}, "
        f"the whole day {d['full_day_repeat_share']:.0%}); profile learned from "
        f"{d['week1_history_requests']:,} week-1 requests; system prompts (tokens): "
        + ", ".join(f"{k} {v}" for k, v in d["system_prompt_tokens"].items()),
        f"hit rate over the day: {day['hit_rate']:.1%} (exact {day['exact_share']:.1%}, "
        f"semantic {day['semantic_share']:.1%}; miss {day['miss_share']:.1%}, bypass "
        f"{day['bypass_share']:.1%}, errors {day['error']})",
        "per tenant: "
        + ", ".join(
            f"{k} {v['hit_rate']:.1%} of {v['requests']}" for k, v in h["per_tenant"].items()
        ),
        f"around the deploy: hours {before['hours']} {before['hit_rate']:.1%}, "
        f"hours {after['hours']} {after['hit_rate']:.1%}",
        f"false semantic hits: {fs['false']} of {fs['semantic_hits_scored']} scored",
        f"what the checks met: {k['hits_on_changed_articles_after_kb_change']} hits on the "
        f"changed articles after the KB change, {k['hits_after_cutover']} hits after the "
        f"cutover, {k['semantic_hits_scored']} semantic hits",
        f"cross-tenant hits: {c['crossed']}; stale hits: {c['stale']} "
        f"({c['stale_after_invalidation_applied']} after the invalidation applied); "
        f"retired-model hits: {c['retired']}; unattributed: {c['unattributed']} "
        f"(of {c['hits']} hits)",
        f"ambiguous, not counted as wrong: {c['ambiguous']} of the {c['hits']} hits; by check, "
        f"overlapping (one hit may be ambiguous for several): tenant {c['mixed']}, stale "
        f"{c['stale_ambiguous']}, retired {c['retired_ambiguous']}",
        f"TTFT of the first {t['cold']['n']} requests after the deploy's restart: "
        f"cold p50 {_s(t['cold']['p50_ms'])} p99 {_s(t['cold']['p99_ms'])}; after the prefix "
        f"warm p50 {_s(t['prefix_warmed']['p50_ms'])} p99 {_s(t['prefix_warmed']['p99_ms'])} "
        f"(ratio p50 {t['p50_ratio']}, p99 {t['p99_ratio']}); the prefix warm took "
        f"{t['prefix_warm'].get('seconds', 0)} s",
        f"backend seconds (llama.cpp's timings): live misses {b['by_source_s']['live']} s "
        f"(request log: {b['request_log_gpu_s']} s), warming {b['warming_s']} s "
        f"({b['warming_share']:.0%} of the two), probes {b['by_source_s']['probe']} s; the "
        f"server held a request {b['server_busy_s']} s of the run's wall time",
        f"run: {report['run']['seconds']:.0f} s, load average "
        f"{_load(report['run']['load_average'])}",
    ]
    lines += [f"note: {n}" for n in report.get("notes", ())]
    # wrapped here, between words, with a hanging indent: printed as is, and in summary.txt,
    # each line fits 80 columns (a pipe or a log file soft-wrapped them mid-word)
    wrap = textwrap.TextWrapper(
        SUMMARY_WIDTH, subsequent_indent="  ", break_long_words=False, break_on_hyphens=False
    )
    return "\n".join(wrap.fill(line) for line in lines)


def _s(ms: float | None) -> str:
    return "-" if ms is None else f"{ms / 1000:.2f} s"


def _r(x: float | None) -> float | None:
    return None if x is None else round(x, 1)


def _load(load: dict[str, list[float]]) -> str:
    return "; ".join(f"{k} {' '.join(f'{x:.1f}' for x in v)}" for k, v in load.items())
