"""eval-semantic's results: the rows of one run and the headline lines drawn from them
(semantic_quality_<data>, its cold start over the first queries, and on a real model
semantic_quality_<data>_real, where <data> is clinc or a --data file's name), each naming
where its answers came from."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from caches.matching.cold import DEFAULT_COLD
from caches.matching.error_budget import MemoryCounts
from evals.score import FIRST, QualityRow

if TYPE_CHECKING:
    from evals.data import Stream

BASELINE = 0.92  # the static threshold every other figure is compared with (DESIGN.md default)
PROMPT_ONLY = f"prompt_only_{DEFAULT_COLD.score:.2f}"


@dataclass
class Evaluation:
    rows: list[QualityRow]
    embed_seconds: float
    stream: Stream
    evidence: MemoryCounts | None = None  # the budget's counts after the earlier traffic
    answers_from: str = "simulated: told each query's intent"
    # what the summary lines are named after: CLINC150, or a --data file's name (data_name)
    data: str = "clinc"

    def row(self, name: str) -> QualityRow:
        return next(r for r in self.rows if r.name == name)

    def summary(self) -> dict[str, Any]:
        """The issue's headline line: verified beside static 0.92, with the monitor's bound of
        the wrong rate beside the true one."""
        ours = self.row("stoker").as_dict()
        base = self.row(f"static_{BASELINE:.2f}").as_dict()
        names = {r.name for r in self.rows}
        cold = self.row("stoker_cold").as_dict() if "stoker_cold" in names else ours
        history = self.row("history").as_dict() if "history" in names else None
        return {
            "name": f"semantic_quality_{self.data}",
            "hit_rate": ours["hit_rate"],
            "wrong_share": ours["wrong_share"],
            "oos_hit_rate": ours["oos_hit_rate"],
            "ceiling": ours["ceiling"],
            "static092_hit_rate": base["hit_rate"],
            "static092_wrong_share": base["wrong_share"],
            "ratio": ours["hit_rate"] / max(base["hit_rate"], 1e-9),
            # None, with the reason, where the monitor's judgement says nothing (its answers
            # do not tell meanings apart: semantic._Tally)
            "monitor_bound": ours["monitor_bound"],
            "monitor_informative": ours["monitor_informative"],
            **{k: ours[k] for k in ("monitor_reason", "monitor_answer_bound") if k in ours},
            "true_wrong": ours["wrong_share"],
            "bound_covers": (
                None
                if ours["monitor_bound"] is None
                else ours["monitor_bound"] >= ours["wrong_share"]
            ),
            # The matcher's decision per lookup (agreement checks, the fallback's rule), each a
            # percentile of its own durations; the whole lookup (search + decision) beside
            # static 0.92's in the same run.
            "verification_ms_p50": ours["verification_ms_p50"],
            "verification_ms_p99": ours["verification_ms_p99"],
            "lookup_ms_p50": ours["lookup_ms_p50"],
            "lookup_ms_p99": ours["lookup_ms_p99"],
            "static092_lookup_ms_p50": base["lookup_ms_p50"],
            "static092_lookup_ms_p99": base["lookup_ms_p99"],
            "queries": ours["queries"],
            "final_level": ours["final_level"],
            # Earlier traffic's verdicts carried into the stream (0: a cold start), and the same
            # matcher started cold beside it.
            "history_queries": history["queries"] if history else 0,
            "cold_hit_rate": cold["hit_rate"],
            "cold_wrong_share": cold["wrong_share"],
            "cold_ratio": cold["hit_rate"] / max(base["hit_rate"], 1e-9),
            "cold_final_level": cold["final_level"],
            "answers": ours.get("answers"),
            "answers_from": self.answers_from,
        }

    def cold_summary(self) -> dict[str, Any]:
        """A young cache: the verified matcher started with no earlier verdicts, over the
        stream's first FIRST queries, beside static 0.92 and the cold rule's prompt-only bound
        over the same queries."""
        names = {r.name for r in self.rows}
        cold = self.row("stoker_cold" if "stoker_cold" in names else "stoker").as_dict()
        base = self.row(f"static_{BASELINE:.2f}").as_dict()
        bound = self.row(PROMPT_ONLY).as_dict() if PROMPT_ONLY in names else None
        f = f"first{FIRST}"
        return {
            "name": f"semantic_quality_{self.data}_cold_{f}",
            "queries": min(cold["queries"], FIRST),
            "hits": cold[f"{f}_hits"],
            "hit_rate": cold[f"{f}_hit_rate"],
            "wrong_share": cold[f"{f}_wrong_share"],
            "static092_hits": base[f"{f}_hits"],
            "static092_hit_rate": base[f"{f}_hit_rate"],
            "static092_wrong_share": base[f"{f}_wrong_share"],
            "ratio": cold[f"{f}_hit_rate"] / max(base[f"{f}_hit_rate"], 1e-9),
            # The cold rule served on the prompts alone (no answer vetoes, never closed): what
            # it serves whatever the backend's answers say; no simulated answer enters it.
            "prompt_only_hits": bound[f"{f}_hits"] if bound else None,
            "prompt_only_wrong_share": bound[f"{f}_wrong_share"] if bound else None,
            # The same runs over the whole stream.
            "stream_queries": cold["queries"],
            "stream_hit_rate": cold["hit_rate"],
            "stream_wrong_share": cold["wrong_share"],
            "stream_static092_hit_rate": base["hit_rate"],
            "stream_static092_wrong_share": base["wrong_share"],
            "hits_by_rule": cold["hits_by_rule"],
            "final_level": cold["final_level"],
            "final_cold_open": cold["final_cold_open"],
            "goal_ratio_min": 1.0,
            "goal_wrong_share_max": 0.01,
            "answers_from": self.answers_from,
        }

    def real_summary(self, report: dict[str, Any]) -> dict[str, Any]:
        """The real model's headline (semantic_quality_clinc_real): the summary, with every
        candidate's figures side by side and what the answers cost (`report`: AskReport)."""
        s = {**self.summary(), "name": f"semantic_quality_{self.data}_real", **report}
        base = self.row(f"static_{BASELINE:.2f}").as_dict()
        cands = {}
        for r in self.rows:
            d = r.as_dict()
            cands[d["name"]] = {
                "hits": d["hits"], "hit_rate": round(d["hit_rate"], 4),
                "wrong_share": round(d["wrong_share"], 4),
                "ratio": round(d["hit_rate"] / max(base["hit_rate"], 1e-9), 3),
            }  # fmt: skip
        s["candidates"] = cands
        s["never_below_static"] = (
            s["hit_rate"] >= base["hit_rate"] and s["wrong_share"] <= base["wrong_share"]
        )
        s["goal_ratio_min"], s["goal_wrong_share_max"] = 2.0, 0.01
        return s
