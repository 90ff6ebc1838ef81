"""Every benchmark runs and prints what `make bench` promises: one JSON object per line with a
name and its figures. Tiny sizes: this guards the scripts, it does not measure anything (speed
is the benchmarks' job, on a quiet machine)."""

from __future__ import annotations

import os
import subprocess
import sys
from datetime import datetime
from pathlib import Path

import numpy as np
import orjson
import pytest

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"

# script -> (tiny arguments, names it must print). Scripts not listed fail the last test.
TINY: dict[str, tuple[list[str], set[str]]] = {
    "bench_cache_exact.py": (["--entries", "40", "--rounds", "1"], {"cache_exact_lookup"}),
    "bench_metrics_overhead.py": (
        ["--entries", "40", "--rounds", "1"],
        {"metrics_overhead_exact_lookup"},
    ),
    "bench_cache_semantic.py": (
        ["--entries", "400", "--tenants", "2", "--queries", "10"],
        {"cache_semantic_lookup"},
    ),
    "bench_ingest.py": (
        ["--events", "40000", "--rounds", "1"],
        {"ingest_traffic", "ingest_traffic_replay"},
    ),
    "bench_ingest_scaling.py": (["--events", "60000", "--rounds", "1"], {"ingest_scaling"}),
    "bench_ingest_cpu.py": (
        ["--events", "40000", "--rounds", "1"],
        {"ingest_traffic_cpu", "ingest_traffic_replay_cpu"},
    ),
    "bench_purge.py": (
        ["--keys", "3000", "--throttled-keys", "2000", "--rounds", "1", "--rate", "4000"],
        {"purge_unthrottled", "purge_throttled"},
    ),
    "bench_invalidation.py": (
        ["--seconds", "1", "--rates", "50"],
        {"invalidation_latency_50"},
    ),
    "bench_warm_qps.py": (["--rates", "5", "--seconds", "1"], {"warm_qps_5"}),
    "bench_gateway.py": (
        [
            "--no-litellm",
            "--seconds",
            "1",
            "--misses",
            "10",
            "--load-seconds",
            "2",
            "--load-concurrency",
            "12",
        ],
        {"gateway_hit", "gateway_miss_overhead", "gateway_herd", "gateway_load"},
    ),
    "bench_gateway_semantic.py": (
        [
            "--seconds",
            "2",
            "--intents",
            "3",
            "--per-intent",
            "3",
            "--clients",
            "4",
            "--no-baseline",
            "--runs",
            "1",
        ],
        {"gateway_semantic_load"},
    ),
    "bench_profile_memory.py": (["--scale", "0.005"], {"profile_memory"}),
    # the embedded llama-server: 3 misses and their repeats, once
    "bench_miss_cost.py": (
        ["--questions", "3", "--runs", "1", "--max-tokens", "16"],
        {"miss_cost_real"},
    ),
    "bench_idle_cpu.py": (["--seconds", "2", "--settle-s", "0"], {"idle_cpu"}),
    "bench_hot_set_bounded.py": (
        ["--distinct", "5000", "--week-capacity", "500", "--hour-capacity", "50"],
        {"hot_set_bounded"},
    ),
    "bench_l1.py": (
        ["--keys", "200", "--readers", "2", "--reads", "500", "--rounds", "1"],
        {"l1_exact_hits"},
    ),
    "bench_prefix_warm.py": (
        [
            "--templates",
            "8",
            "--quiet-requests",
            "12",
            "--busy-requests",
            "16",
            "--learn-requests",
            "200",
            "--top-n",
            "4",
            # the real prefix cache's row: one 500-token system prompt, two requests
            "--real-templates",
            "1",
            "--real-requests",
            "2",
        ],
        {"prefix_warm", "prefix_warm_busy", "prefix_warm_real"},
    ),
}


def _run(script: str, args: list[str], **more_env: str) -> dict[str, dict]:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", **more_env}
    out = subprocess.run(
        [sys.executable, script, *args],
        cwd=BENCH,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    rows = [orjson.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    return {r["name"]: r for r in rows}


@pytest.mark.parametrize("script", sorted(TINY))
def test_benchmark__runs_and_prints_named_json(script):
    args, names = TINY[script]
    rows = _run(script, args)
    assert names <= set(rows), f"{script} printed {sorted(rows)}"
    for name in names:
        row = rows[name]
        assert any(isinstance(v, int | float) for k, v in row.items() if k != "name"), row


def test_benchmark__make_bench_results_file_holds_every_line_with_its_script(tmp_path):
    results = tmp_path / "results.jsonl"
    opened = subprocess.run(
        [sys.executable, "_provenance.py"], cwd=BENCH, capture_output=True, text=True, timeout=60,
        check=True,
    ).stdout  # fmt: skip
    results.write_text(opened)
    # a script that starts stoker's own workers: the results file's variable reaches them too,
    # and a stoker verb rejects a STOKER_ name it does not know (make bench once failed so)
    script = "bench_ingest_cpu.py"
    rows = _run(script, TINY[script][0], BENCH_RESULTS_FILE=str(results))
    lines = [orjson.loads(x) for x in results.read_text().splitlines()]
    head, written = lines[0], lines[1:]
    head_commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=BENCH, capture_output=True,
                                 text=True, check=True).stdout.strip()  # fmt: skip
    assert head["name"] == "provenance" and head["commit"] == head_commit
    assert head["machine"]["cpus"] == os.cpu_count() and len(head["load_avg"]) == 3
    assert datetime.fromisoformat(head["date"]).tzinfo is not None
    # each printed line, as printed, plus the script that printed it
    assert [r["script"] for r in written] == [script] * len(rows)
    assert [r["args"] for r in written] == [TINY[script][0]] * len(rows)
    assert {
        r["name"]: {k: v for k, v in r.items() if k not in ("script", "args")} for r in written
    } == rows


def test_benchmark__every_script_is_guarded_or_named_as_slow():
    # The slow ones need the whole CLINC150 embedding pass or minutes of wall time; they are
    # run by `make bench`, and this list keeps a new script from slipping past both.
    slow = {"bench_hot_set.py", "bench_semantic_quality.py", "bench_backend_protection.py",
            "bench_analyze_1m.py", "bench_warm_vs_naive.py", "bench_analyze_warming.py"}  # fmt: skip
    scripts = {p.name for p in BENCH.glob("bench_*.py")}
    assert scripts == set(TINY) | slow


class _Axes:
    """Each text a unit vector: 'a1' and 'a2' on axis a (cosine 1), other letters apart."""

    dim = 26

    def embed(self, texts: list[str]) -> np.ndarray:
        out = np.zeros((len(texts), self.dim), np.float32)
        for i, t in enumerate(texts):
            out[i, ord(t[0]) - ord("a")] = 1.0
        return out


def test_coverage_scorer__pick_is_the_choice_the_oracle_counts():
    # The hot-set bench scores a choice made on one span (week 1, or week 2's rates) on each
    # day with served(); the oracle's count must be what its own choice serves.
    sys.path.insert(0, str(BENCH))
    try:
        from _coverage import Scorer
    finally:
        sys.path.remove(str(BENCH))
    sc = Scorer(_Axes())
    asked = ["a1", "a2", "a1", "b1", "b1", "c1", "d1", "d1", "d1"]
    logged = ["a9", "b9", "d9", "e9"]
    picked = sc.pick(asked, 2, logged)
    assert picked == ["a9", "d9"]  # 3 requests each, ahead of b's 2; e serves none
    assert sc.oracle(asked, 2, logged) == sc.served(asked, picked) == 6
    assert sc.pick(asked, 9, logged) == ["a9", "d9", "b9"]  # stops when nothing more is served
    assert sc.served(["c1", "e1"], picked) == 0


def test_verified_scorer__a_warmed_paraphrase_is_served_only_where_others_vouch():
    # The hot-set bench's verified rows: a request that is a warmed text is served (the exact
    # cache); a paraphrase only when the matcher, at its level, finds warmed neighbours whose
    # answers agree. The answers are fixed here (the bench gets them from the simulator).
    sys.path.insert(0, str(BENCH))
    try:
        from _verified import SimAnswers, VerifiedScorer
    finally:
        sys.path.remove(str(BENCH))

    def unit(cos: float, axis: int) -> np.ndarray:
        v = np.zeros(5, np.float32)
        v[0], v[axis] = cos, (1 - cos**2) ** 0.5
        return v

    vecs = {"q": unit(1.0, 1), "p1": unit(0.9, 1), "p2": unit(0.85, 2), "p3": unit(0.8, 3)}

    class Fixed:
        dim = 5

        def embed(self, texts: list[str]) -> np.ndarray:
            return np.stack([vecs[t] for t in texts])

    vs = VerifiedScorer(Fixed(), SimAnswers(Fixed(), {}), level=3)  # cos >= 0.66, 2 agree
    same, other = np.eye(5, dtype=np.float32)[4], np.eye(5, dtype=np.float32)[3]
    vs.answers = lambda prompts: np.stack([same for _ in prompts])  # type: ignore[assignment]
    assert vs.served(["q", "q"], ["p1"]) == 0  # a lone entry: nobody vouches
    assert vs.served(["q", "q"], ["p1", "p2", "p3"]) == 2  # two agreeing neighbours vouch
    assert vs.served(["p1", "q"], ["p1"]) == 1  # the warmed text itself: an exact hit
    # the nearest answered otherwise: no entry has two neighbours agreeing with it
    vs.answers = lambda prompts: np.stack(  # type: ignore[assignment]
        [same if p == "p1" else other for p in prompts]
    )
    assert vs.served(["q"], ["p1", "p2", "p3"]) == 0


def test_seed_rows__each_number_is_its_mean_over_the_seeds_with_its_spread(capsys):
    # bench_hot_set's --seeds: one line per row, whatever the number of runs behind it.
    sys.path.insert(0, str(BENCH))
    try:
        from _common import SeedRows
    finally:
        sys.path.remove(str(BENCH))
    rows = SeedRows()
    for cov, secs in ((0.5, 3), (0.7, 5), (0.6, 4)):
        rows.add("hot_set_k50", k=50, scored="intent labels", coverage=cov, seconds=secs, ok=True)
    rows.add("hot_set_k200", k=200, coverage=0.9)
    rows.emit([150, 151, 152])
    lines = [orjson.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert [x["name"] for x in lines] == ["hot_set_k50", "hot_set_k200"]
    k50 = lines[0]
    assert k50["coverage"] == pytest.approx(0.6) and k50["seconds"] == pytest.approx(4)
    assert k50["k"] == 50 and isinstance(k50["k"], int)  # the same in every run: as it was
    assert k50["scored"] == "intent labels" and k50["ok"] is True
    assert k50["seeds"] == [150, 151, 152]
    spread = k50["over_seeds"]["coverage"]
    assert (spread["min"], spread["max"], spread["runs"]) == (0.5, 0.7, 3)
    assert spread["sd"] == pytest.approx(0.1)
    assert "scored" not in k50["over_seeds"] and "ok" not in k50["over_seeds"]
    assert lines[1]["over_seeds"]["coverage"]["runs"] == 1  # a row of one run says so


def _flags(script: str) -> set[str]:
    """The options a script's argparse declares, read from its source."""
    import re

    return set(re.findall(r'add_argument\(\s*"(--[a-z0-9-]+)"', (BENCH / script).read_text()))


def test_benchmark__make_bench_runs_every_script_and_keeps_the_slow_rows_behind_the_flag():
    sys.path.insert(0, str(BENCH))
    try:
        import _run
    finally:
        sys.path.remove(str(BENCH))
    fast, slow = _run.commands(slow=False), _run.commands(slow=True)
    scripts = {p.name for p in BENCH.glob("bench_*.py")}
    skipped = {name for name, (args, _) in _run.FAST.items() if args == _run.SKIP}
    assert {c[0] for c in slow} == scripts and {c[0] for c in fast} == scripts - skipped
    assert "bench_analyze_1m.py" in skipped
    # each script's default run leaves out what the table says, with flags it declares
    for cmd in fast + slow:
        assert {a for a in cmd[1:] if a.startswith("--")} <= _flags(cmd[0]), cmd
    assert ["bench_backend_protection.py"] in slow and ["bench_prefix_warm.py"] in slow
    assert ["bench_backend_protection.py", "--no-real"] in fast
    out = subprocess.run(
        [sys.executable, "_run.py", "--dry-run"], cwd=BENCH, capture_output=True, text=True,
        timeout=60, check=True,
    ).stdout.splitlines()  # fmt: skip
    assert out == ["benchmarks/" + " ".join(c) for c in fast]


def _results(path: Path, slow: bool, lines: list[dict[str, object]]) -> Path:
    """A results file as make bench writes it: provenance, the lines, provenance_end."""
    args = ["--slow", "--only", "bench_prefix_warm.py"] if slow else []
    head = subprocess.run(
        [sys.executable, "_provenance.py", *args], cwd=BENCH, capture_output=True, text=True,
        timeout=60, check=True,
    ).stdout  # fmt: skip
    end = '{"name": "provenance_end", "date": "2026-12-07T00:00:00+00:00", "load_avg": [1, 1, 1]}'
    path.write_text(head + "".join(orjson.dumps(x).decode() + "\n" for x in lines) + end + "\n")
    return path


def test_tables__slow_runs_fill_their_own_block_with_the_lines_no_default_run_prints(tmp_path):
    sys.path.insert(0, str(BENCH))
    try:
        import _tables
    finally:
        sys.path.remove(str(BENCH))
    sim = {"script": "bench_prefix_warm.py", "name": "prefix_warm", "ttft_p50_ratio": 0.45,
           "goal_ttft_p50_ratio_max": 0.5}  # fmt: skip
    real = {"script": "bench_prefix_warm.py", "name": "prefix_warm_real", "ttft_p50_ratio": 0.3,
            "ttft_p50_ratio_per_run": [0.2, 0.4], "with_p50_ms": 900.0, "seconds": 61.0,
            "goal_ttft_p50_ratio_max": 0.2,
            "over_runs": {"with_p50_ms": {"mean": 900.0, "min": 800.0, "max": 1000.0,
                                          "runs": 3}}}  # fmt: skip
    default = _results(tmp_path / "a.jsonl", False, [{**sim, "args": ["--no-real"]}])
    slow = _results(tmp_path / "b.jsonl", True, [{**sim, "args": []}, {**real, "args": []}])
    assert orjson.loads(slow.read_text().splitlines()[0])["only"] == ["bench_prefix_warm.py"]
    doc = "\n".join(["x", _tables.BEGIN, _tables.END, "y", _tables.SLOW_BEGIN, _tables.SLOW_END])
    got = _tables.filled(doc, [default, slow])
    first, second = got.split(_tables.SLOW_BEGIN)
    # the default table: the default run's line alone; the slow one: what no default run prints
    assert "`prefix_warm`" in first and "prefix_warm_real" not in first
    assert "`prefix_warm_real`" in second and "`prefix_warm`" not in second
    row = next(x for x in second.splitlines() if x.startswith("| `prefix_warm_real`"))
    # its goal's figure, then the figures the docs discuss, then the run's own seconds
    # (a figure that is a mean over the line's own runs shows their range)
    assert (
        "ttft_p50_ratio 0.3, ttft_p50_ratio_per_run [0.2, 0.4], with_p50_ms 900 (800-1000, 3 runs),"
        in row
    )
    assert row.endswith("| ttft_p50_ratio <= 0.2 | 0 of 1 |") and "seconds 61" in row
    assert "Scripts: bench_prefix_warm.py." in second
    # measured again at a newer commit: the newer figure replaces the older, and is no mean
    head, *body = slow.read_text().splitlines()
    newer = orjson.loads(head) | {"commit": "f" * 40, "date": "2099-01-01T00:00:00+00:00"}
    again = tmp_path / "c.jsonl"
    again.write_text("\n".join([orjson.dumps(newer).decode(), *body]).replace("0.3", "0.1"))
    row = next(
        x
        for x in _tables.filled(doc, [default, slow, again]).splitlines()
        if x.startswith("| `prefix_warm_real`")
    )
    assert "ttft_p50_ratio 0.1, " in row and row.endswith("| 1 of 1 |")
    # no slow run given: the block says so, and it is regenerated (not left as it was)
    assert "No run with the slow rows is recorded." in _tables.filled(got, [default])
    with pytest.raises(SystemExit, match="no default run"):
        _tables.filled(doc, [slow])


def test_tables__a_pivot_table_comes_from_the_newest_commit_s_runs_of_its_own_command(tmp_path):
    sys.path.insert(0, str(BENCH))
    try:
        import _tables
    finally:
        sys.path.remove(str(BENCH))

    def line(k: int, dataset: str, ratio: float, args: list[str]) -> dict[str, object]:
        return {"script": "bench_warm_vs_naive.py", "args": args, "name": f"warm_vs_naive_k{k}",
                "dataset": dataset, "k": k, "ratio_vs_naive": ratio, "requests": 900,
                "items_per_plan": float(k), "plan_s_max": 1.5, "seeds": [0, 1, 2],
                "over_seeds": {"ratio_vs_naive": {"mean": ratio, "min": ratio - 0.01,
                                                  "max": ratio + 0.02, "runs": 3}}}  # fmt: skip

    default = _results(tmp_path / "a.jsonl", False, [line(50, "sample", 0.5, ["--seeds", "1"])])
    lines = [line(k, d, 1.0 + k / 1e4, []) for d in ("drift", "sample") for k in (50, 200)]
    slow = _results(tmp_path / "b.jsonl", True, lines)
    marks = ["<!-- bench-table:warm-vs-naive:begin (generated: do not edit) -->",
             "<!-- bench-table:warm-vs-naive:end -->"]  # fmt: skip
    doc = "\n".join([_tables.BEGIN, _tables.END, _tables.SLOW_BEGIN, _tables.SLOW_END, *marks])
    got = _tables.filled(doc, [default, slow]).split(marks[0])[1]
    # a row per dataset, a column per K, each cell the mean over the seeds with their range;
    # the default run's line (other arguments) is no part of it
    assert "| dataset | k=50 | k=200 | requests | items_per_plan | plan_s_max |" in got
    assert "| drift | 1.005 (0.995-1.025) | 1.02 (1.01-1.04) | 900 | 50 | 1.5 |" in got
    assert "| sample | 1.005 (0.995-1.025) |" in got and "| 0.5 |" not in got
    assert "`.venv/bin/python benchmarks/bench_warm_vs_naive.py`, recorded in `b.jsonl`" in got
    # the lines a pivot tables are not repeated in the slow block
    block = _tables.filled(doc, [default, slow]).split(_tables.SLOW_BEGIN)[1].split(marks[0])[0]
    assert "warm_vs_naive_k" not in block and "Each of their lines is in a table below." in block

    # a run of a newer commit replaces the table; another run of the same commit is averaged
    # with it (each cell the mean over the runs, with their range); no run at all says so
    def rerun(name: str, commit: str | None) -> Path:
        head, *body = _results(tmp_path / name, True, [line(50, "drift", 2.0, [])]).read_text(
        ).splitlines()  # fmt: skip
        newer = orjson.loads(head) | {"date": "2099-01-01"} | ({"commit": commit} if commit else {})
        (tmp_path / name).write_text("\n".join([orjson.dumps(newer).decode(), *body]))
        return tmp_path / name

    got = _tables.filled(doc, [default, slow, rerun("c.jsonl", "f" * 40)]).split(marks[0])[1]
    assert "| drift | 2 (1.99-2.02) |" in got and "sample" not in got
    got = _tables.filled(doc, [default, slow, rerun("d.jsonl", None)]).split(marks[0])[1]
    assert "each cell the mean over its 2 runs, with their range" in got
    assert "| drift | 1.502 (1.005-2) | 1.02 (1.01-1.04) |" in got and "| sample |" in got
    empty = _tables.filled(doc, [default]).split(marks[0])[1]
    assert "No recorded run of `benchmarks/bench_warm_vs_naive.py` yet." in empty


def test_tables__a_pivot_of_a_list_field_makes_a_row_of_each_item(tmp_path):
    sys.path.insert(0, str(BENCH))
    try:
        import _tables
    finally:
        sys.path.remove(str(BENCH))
    cands = [{"name": "shipped", "rule": "as shipped", "hits": 33, "ratio": 1.65},
             {"name": "guarded_0.84", "rule": "cos>=0.84", "hits": 49, "ratio": 2.45,
              "full_ratio": 1.957}]  # fmt: skip
    row = {"script": "bench_semantic_quality.py", "args": [], "name": "semantic_candidates_real",
           "candidates": cands}  # fmt: skip
    default = _results(tmp_path / "a.jsonl", False, [{**row, "name": "other"}])
    slow = _results(tmp_path / "b.jsonl", True, [row])
    got = _tables.pivot_block("c", _tables.PIVOTS["semantic-candidates"], _tables.runs_of(slow))
    assert "| shipped | as shipped | 33 |" in got and "| 1.65 |  |  |" in got
    assert "| guarded_0.84 | cos>=0.84 | 49 |" in got and "| 2.45 |  | 1.957 |" in got
    assert "No recorded run" in _tables.pivot_block(
        "c", _tables.PIVOTS["semantic-candidates"], _tables.runs_of(default)
    )


def test_tables__a_name_printed_per_dataset_makes_a_row_of_each_never_their_mean(tmp_path):
    sys.path.insert(0, str(BENCH))
    try:
        import _tables
    finally:
        sys.path.remove(str(BENCH))
    line = {"script": "bench_analyze_warming.py", "args": ["--shapes"],
            "name": "analyze_warming_ttl_1d", "peak_gpu_ratio": 0.9,
            "goal_peak_gpu_ratio_max": 0.9}  # fmt: skip
    default = _results(tmp_path / "a.jsonl", False, [{**line, "name": "other", "args": []}])
    slow = _results(
        tmp_path / "b.jsonl", True,
        [{**line, "dataset": "drift", "peak_gpu_ratio": 0.8},
         {**line, "dataset": "quiet", "peak_gpu_ratio": 1.0}],
    )  # fmt: skip
    doc = "\n".join([_tables.BEGIN, _tables.END, _tables.SLOW_BEGIN, _tables.SLOW_END])
    rows = [
        x for x in _tables.filled(doc, [default, slow]).splitlines() if "analyze_warming_ttl" in x
    ]
    assert len(rows) == 2
    assert rows[0].startswith("| `analyze_warming_ttl_1d` on drift |") and "ratio 0.8 |" in rows[0]
    assert rows[1].startswith("| `analyze_warming_ttl_1d` on quiet |") and "ratio 1 |" in rows[1]
    assert rows[0].endswith("| 1 of 1 |") and rows[1].endswith("| 0 of 1 |")


def test_prefix_warm_real__a_first_request_is_held_by_the_server_s_own_count(llama):
    # prefix_warm_real says why a first request was slow from what llama-server reports of
    # each request (timings.cache_n in its last chunk). A prompt never sent is not held; asked
    # again with another question, it is: if the server stopped saying, or the parse broke,
    # every first request would read as not held, or None.
    import asyncio
    import uuid

    import httpx

    sys.path.insert(0, str(BENCH))
    try:
        from bench_prefix_warm import REAL, WORDS, count_tokens, firsts, reply
    finally:
        sys.path.remove(str(BENCH))
    root = llama.base_url.removesuffix("/v1")
    system = f"You are assistant {uuid.uuid4().hex}. " + " ".join(WORDS * 8)
    tokens = count_tokens(root, system)

    def ask(question: str) -> tuple[float | None, int | None]:
        msgs = [{"role": "system", "content": system}, {"role": "user", "content": question}]

        async def once() -> tuple[float | None, int | None]:
            async with httpx.AsyncClient(base_url=root, timeout=120) as client:
                return await reply(client, msgs, REAL, whole=True)

        return asyncio.run(once())

    cold, again = ask("What is a refund?"), ask("How do I reset my password?")
    assert cold[0] is not None and cold[1] is not None and again[1] is not None
    assert cold[1] < tokens / 2 <= again[1]
    (first,) = firsts([3, 3], [cold, again], [0, 0, 0, tokens])
    assert (first.template, first.held) == (3, False)
    (later,) = firsts([3], [again], [0, 0, 0, tokens])
    assert later.held is True
