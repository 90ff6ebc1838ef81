"""The CLINC150 protocol: scoring rules on a hand-made stream, then a short real run."""

from __future__ import annotations

import json

import numpy as np
import pytest

from caches.matching import StaticThreshold
from evals.data import Stream
from evals.semantic import evaluate, load_csv, run_stream, run_verified
from schemas.errors import UsageError
from tests.cli import run_stoker


def _unit(rows: list[list[float]]) -> np.ndarray:
    v = np.asarray(rows, dtype=np.float32)
    return v / np.linalg.norm(v, axis=1, keepdims=True)


def _stream(texts, vecs, labels, answers=None) -> Stream:
    answers = vecs if answers is None else answers
    return Stream(
        list(texts), list(labels), "oos", vecs, list(texts), answers, list(texts), answers
    )


def test_run_stream__scores_wrong_oos_and_ceiling_from_labels_after_the_fact():
    # 0 stored; 1 hits 0 (same intent, right); 2 hits 0 (other intent, wrong);
    # 3 is out of scope and hits 0 (wrong); 4 is far: a miss, stored.
    vecs = _unit([[1, 0, 0], [1, 0.01, 0], [1, 0, 0.01], [1, 0.01, 0.01], [0, 1, 0]])
    texts = ["a", "a2", "b", "z", "c"]
    intents = ["A", "A", "B", "oos", "C"]
    row = run_stream("t", StaticThreshold(0.9), _stream(texts, vecs, intents)).as_dict()
    assert row["queries"] == 5 and row["hits"] == 3 and row["wrong_hits"] == 2
    assert row["oos_hit_rate"] == 1.0
    assert row["ceiling"] == pytest.approx(1 / 5)  # only query 1's intent was cached before it
    assert row["hits_by_rule"] == {"cosine>=0.900": 3}


def test_run_stream__decisions_do_not_depend_on_labels():
    rng = np.random.default_rng(3)
    vecs = _unit(rng.standard_normal((60, 8)).tolist())
    vecs = np.vstack([vecs, vecs + 0.05 * rng.standard_normal((60, 8)).astype(np.float32)])
    vecs = _unit(vecs.tolist())
    texts = [f"t{i}" for i in range(len(vecs))]
    a = [f"i{i % 60}" for i in range(len(vecs))]
    b = [f"j{(i * 7) % 13}" for i in range(len(vecs))]
    ra = run_stream("a", StaticThreshold(0.9), _stream(texts, vecs, a)).as_dict()
    rb = run_stream("b", StaticThreshold(0.9), _stream(texts, vecs, b)).as_dict()
    assert ra["hits"] == rb["hits"] > 0
    assert ra["wrong_hits"] != rb["wrong_hits"]
    va = run_verified("a", _stream(texts, vecs, a), seed=1).as_dict()
    vb = run_verified("b", _stream(texts, vecs, b), seed=1).as_dict()
    assert va["hits"] == vb["hits"] and va["monitor_checked"] == vb["monitor_checked"]


def test_load_csv__names_the_missing_column_and_the_unreadable_file(tmp_path):
    f = tmp_path / "d.csv"
    f.write_text("text,intent\nhello there,greet\n,greet\nbye,leave\n")
    assert load_csv(f, "text", "intent") == [("hello there", "greet"), ("bye", "leave")]
    with pytest.raises(UsageError, match="no column 'label'"):
        load_csv(f, "text", "label")
    with pytest.raises(UsageError, match="no such file"):
        load_csv(tmp_path / "missing.csv", "text", "intent")


def _clinc_val():
    from evals.semantic import load_clinc

    d = load_clinc()
    return d["val"] + d["oos_val"]


def test_evaluate__short_real_run_scores_both_and_the_monitor_bounds_what_it_saw(embedder):
    # 800: the answer checks need ~60 near pairs to show the answers separate at the val-chosen
    # bar (600 left them unknown)
    ev = evaluate(embedder, limit=800, names=["static_0.92", "stoker"])
    static, ours = ev.row("static_0.92").as_dict(), ev.row("stoker").as_dict()
    for r in (static, ours):
        assert r["queries"] == 800
        assert r["hits"] - r["wrong_hits"] <= round(r["ceiling"] * 800)  # right hits are reachable
    ver = ours["verification"]
    assert ver.get("agree", 0) + ver.get("cold", 0) + ver.get("fallback", 0) == ours["hits"]
    rules = ("verified:L", "verified:cold:", "verified:fallback:")
    assert all(rule.startswith(rules) for rule in ours["hits_by_rule"])
    # The simulator's answers tell meanings apart, and the answer checks show it.
    assert ours["answers"] == "separates"
    s = ev.summary()
    assert s["name"] == "semantic_quality_clinc"
    checked, judged = ours["monitor_checked"], ours["monitor_judged_wrong"]
    assert s["monitor_bound"] >= (judged / checked if checked else 0.0)
    assert set(s) >= {"hit_rate", "wrong_share", "static092_hit_rate", "ratio", "true_wrong"}
    # Earlier traffic (CLINC150 val, cut to the same 800) fed the budget; the cold start beside.
    history, cold = ev.row("history").as_dict(), ev.row("stoker_cold").as_dict()
    assert history["queries"] == s["history_queries"] == 800
    assert not set(ev.stream.texts) & {t for t, _ in _clinc_val()}
    assert ours["budget_verdicts"] > history["budget_verdicts"] > 0  # counted on from there
    assert (s["cold_hit_rate"], s["cold_final_level"]) == (cold["hit_rate"], cold["final_level"])
    # The young cache's line: the cold start over the first 500, beside static 0.92's.
    young = ev.cold_summary()
    assert young["name"] == "semantic_quality_clinc_cold_first500" and young["queries"] == 500
    assert (
        young["hits"] == cold["first500_hits"]
        and young["static092_hits"] == static["first500_hits"]
    )
    assert young["prompt_only_hits"] is not None


def test_run_verified__earlier_verdicts_start_the_stream_where_they_allow():
    """The budget's counts carried in decide the first level served; the stream's own verdicts
    count on in them. Far-apart queries: no candidate, so no verdict of the stream's own."""
    from caches.matching.error_budget import MemoryCounts, min_evidence
    from caches.matching.verified import LADDER
    from evals.semantic import _NS

    vecs = np.eye(6, dtype=np.float32)
    st = _stream([f"q{i}" for i in range(6)], vecs, ["a"] * 6)
    strict = len(LADDER) - 1
    assert run_verified("cold", st).as_dict()["final_level"] == strict
    earlier = MemoryCounts()
    for _ in range(min_evidence(0.01)):
        earlier.add(_NS.tenant, "", strict, wrong=False)
    row = run_verified("warm", st, counts=earlier).as_dict()
    assert row["final_level"] == 0 and row["budget_verdicts"] == min_evidence(0.01)
    earlier.add(_NS.tenant, "", strict, wrong=True)  # one wrong verdict: 1% no longer shown
    row = run_verified("warm", st, counts=earlier).as_dict()
    assert row["final_level"] == strict
    # The row says which verdicts held the level: per strength, (checked, judged wrong).
    assert row["budget_by_strength"][strict] == [min_evidence(0.01) + 1, 1]
    assert sum(c for c, _ in row["budget_by_strength"]) == row["budget_verdicts"]


def test_split_history__the_earlier_share_is_apart_from_the_stream():
    from evals.semantic import split_history

    rows = [(f"t{i}", f"l{i % 3}") for i in range(100)]
    assert split_history(rows, 0.0, 1) == (rows, None)
    stream, earlier = split_history(rows, 0.3, 1)
    assert earlier is not None and (len(stream), len(earlier)) == (70, 30)
    assert sorted(stream + earlier) == sorted(rows)
    with pytest.raises(UsageError, match="no earlier traffic"):
        split_history(rows[:2], 0.3, 1)


def test_history_stream__train_val_is_val_with_the_train_split_and_val_stays_the_default():
    from evals.data import history_stream, load_clinc

    d = load_clinc()
    val, long = history_stream(d, 7), history_stream(d, 7, "train+val")
    assert val == history_stream(d, 7, "val")  # the default protocol's history is unchanged
    texts = [t for t, _ in long]
    assert len(long) == len(val) + len(d["train"]) + len(d["oos_train"])
    assert set(texts) >= {t for t, _ in d["train"] + d["oos_train"]} | {t for t, _ in val}
    assert texts[:100] != [t for t, _ in d["train"][:100]]  # shuffled, not split after split
    with pytest.raises(UsageError, match=r"one of val, train\+val"):
        history_stream(d, 7, "train")


def _tiny_clinc(root) -> None:
    """A CLINC150-shaped file: 4 earlier queries in val + oos_val, 20 in train + oos_train."""
    intents = ("balance", "transfer", "weather", "alarm")
    rows = {
        "val": [[f"what about my {i} please", i] for i in intents[:3]],
        "oos_val": [["how tall is a giraffe", "oos"]],
        "train": [[f"tell me my {i} number {k}", i] for i in intents for k in range(5)][:19],
        "oos_train": [["who painted the ceiling", "oos"]],
        "test": [[f"show my {i}", i] for i in intents] * 2,
        "oos_test": [["what rhymes with orange", "oos"]],
    }
    (root / "clinc150").mkdir()
    (root / "clinc150" / "data_full.json").write_text(json.dumps(rows))


@pytest.mark.parametrize(("split", "earlier"), [("val", 4), ("train+val", 12)])
def test_cli__history_split_picks_the_earlier_traffic_the_budget_counts_from(
    tmp_path, split, earlier
):
    # --history-limit 12: all of val (4), or 12 of train + val's 24; the stream is test's 9.
    _tiny_clinc(tmp_path)
    res = run_stoker(
        "eval-semantic", "--simulated", "--history-split", split, "--history-limit", "12",
        "--only", "static_0.92,stoker", "--json",
        env={"STOKER_DATA_DIR": str(tmp_path)}, timeout=240,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr[-3000:]
    rows = {r["name"]: r for r in map(json.loads, res.stdout.splitlines())}
    assert rows["history"]["queries"] == rows["semantic_quality_clinc"]["history_queries"]
    assert rows["history"]["queries"] == earlier and rows["stoker"]["queries"] == 9


def test_cli__a_data_file_names_its_summary_lines_after_itself(tmp_path):
    csv = tmp_path / "Bank Queries.csv"
    lines = ["text,intent"]
    for i in range(6):
        lines += [f"how do I freeze my card {i},freeze", f"what is my balance today {i},balance"]
    csv.write_text("\n".join(lines) + "\n")
    res = run_stoker(
        "eval-semantic", "--simulated", "--data", str(csv), "--label-col", "intent",
        "--history-share", "0.3",
        "--only", "static_0.92,stoker", "--json", timeout=240,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr[-3000:]
    names = {r["name"] for r in map(json.loads, res.stdout.splitlines())}
    assert "semantic_quality_bank_queries" in names
    assert not any(n.startswith("semantic_quality_clinc") for n in names)
