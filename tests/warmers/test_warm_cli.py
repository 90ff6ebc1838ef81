"""`stoker warm` as CI runs it (a subprocess): dry run spends nothing, a run warms, exit codes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import orjson
import pytest
import redis

from simulation.backend.http import SimulatorThread
from stoker.commands.warm import nothing_to_warm
from tests.warmers.hotset_helpers import fill
from tests.warmers.test_hotset import _week
from warmers.hotset.plan import Plan, Skipped
from warmers.hotset.warm_budget import Budget
from warmers.hotset.window import Window
from warmers.traffic.profile import TrafficProfile

WINDOW = "2026-11-09T10:00..2026-11-09T11:00"  # a Monday, after a week of history


def _stoker(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "stoker.cli", *args],
        env={**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", **env},
        capture_output=True,
        text=True,
        timeout=240,
        cwd=Path(__file__).resolve().parents[2],
    )


def _env(redis_url: str, sim: SimulatorThread, tmp_path: Path) -> dict[str, str]:
    return {
        "STOKER_REDIS_URL": redis_url,
        "STOKER_WARM_BACKEND_URL": sim.url,
        "STOKER_QDRANT_PATH": str(tmp_path),
        "STOKER_WARM_MIN_TTL_LEFT_S": "60",
    }


def test_warm_cli__dry_run_prints_the_plan_and_spends_nothing_then_a_run_warms(
    redis_client: redis.Redis, redis_url: str, sim: SimulatorThread, tmp_path: Path
) -> None:
    fill(
        TrafficProfile(redis_client),
        _week("acme", {"what is my balance": 20, "how do i reset my pin": 12}, {}),
    )
    before = sorted(redis_client.keys("*"))
    env = _env(redis_url, sim, tmp_path)
    dry = _stoker(["warm", "--window", WINDOW, "--budget-requests", "2", "--dry-run"], env)
    assert dry.returncode == 0, dry.stderr
    assert "what is my balance" in dry.stderr and "how do i reset my pin" in dry.stderr
    assert "nothing sent" in dry.stderr
    assert sim.stats().served == 0
    assert sorted(redis_client.keys("*")) == before  # not even an embedding was cached

    run = _stoker(["warm", "--window", WINDOW, "--budget-requests", "2", "--qps", "50"], env)
    assert run.returncode == 0, run.stderr
    assert "sent 2, cached 2" in run.stderr
    assert sim.stats().served == 2
    assert len(redis_client.keys("stk:{t:acme}:e:*")) == 2
    again = _stoker(["warm", "--window", WINDOW, "--budget-requests", "2"], env)
    assert again.returncode == 0, again.stderr
    # both fresh: skipped at planning (the budget goes to whatever is next, here the fillers)
    assert "2 cached" in " ".join(again.stderr.split()).split("left out:")[1]
    assert "what is my balance" not in again.stderr

    warm_jobs = _warm_jobs(env)  # both real runs, newest first; the dry run left none
    assert [j["state"] for j in warm_jobs] == ["done", "done"]
    assert warm_jobs[1]["counts"]["sent"] == 2 and warm_jobs[1]["counts"]["landed"] == 2
    assert warm_jobs[1]["labels"]["by"] == "stoker warm"


def test_warm_cli__dry_run_at_80_columns_in_a_pipe_keeps_every_word_whole(
    redis_client: redis.Redis, redis_url: str, sim: SimulatorThread, tmp_path: Path
) -> None:
    """A tenant name and questions longer than the old fixed columns (`initech-pa…`, a
    question cut with `…`): each wraps between words, and no line passes 80 columns."""
    long_q = "how do i move money from my checking account into my savings account tonight"
    fill(
        TrafficProfile(redis_client),
        _week("initech-payments", {long_q: 20, "what is my balance": 12}, {}),
    )
    env = _env(redis_url, sim, tmp_path) | {"COLUMNS": "80"}
    dry = _stoker(["warm", "--window", WINDOW, "--budget-requests", "2", "--dry-run"], env)
    assert dry.returncode == 0, dry.stderr
    lines = dry.stderr.splitlines()
    assert not [line for line in lines if len(line) > 80], dry.stderr
    assert "…" not in dry.stderr
    words = dry.stderr.split()
    assert "initech-payments" in words and "send" in words
    query_column = " ".join(line.split("│")[3] for line in lines if line.startswith("│"))
    assert long_q in " ".join(query_column.split())  # the question whole, wrapped at words


def _warm_jobs(env: dict[str, str]) -> list[dict]:
    status = _stoker(["status", "--json"], env)
    assert status.returncode == 0, status.stderr
    return [j for j in orjson.loads(status.stdout)["jobs"] if j["job_type"] == "warm"]


def test_warm_cli__every_send_failing_exits_1_and_status_shows_a_failed_run(
    redis_client: redis.Redis, redis_url: str, sim: SimulatorThread, tmp_path: Path
) -> None:
    fill(TrafficProfile(redis_client), _week("acme", {"what is my balance": 20}, {}))
    env = _env(redis_url, sim, tmp_path) | {"STOKER_WARM_BACKEND_URL": "http://127.0.0.1:1"}
    run = _stoker(["warm", "--window", WINDOW, "--budget-requests", "1"], env)
    assert run.returncode == 1, run.stderr
    said = " ".join(run.stderr.split())
    assert "warm failed: cannot connect to http://127.0.0.1:1/v1 (STOKER_WARM_BACKEND_URL)" in said
    (job,) = _warm_jobs(env)
    assert job["state"] == "failed" and job["counts"]["failed"] == 1


def test_warm_cli__bad_usage_exits_2(redis_url: str, sim: SimulatorThread, tmp_path: Path) -> None:
    env = _env(redis_url, sim, tmp_path)
    both = _stoker(["warm", "--budget-requests", "1", "--budget-gpu-seconds", "1"], env)
    assert both.returncode == 2 and "one budget" in both.stderr
    bad = _stoker(["warm", "--window", "tomorrow"], env)
    assert bad.returncode == 2 and "next-hour" in bad.stderr


def test_warm_cli__unreachable_redis_exits_1(sim: SimulatorThread, tmp_path: Path) -> None:
    # the dimension given: the simulator embeds nothing, and its 404 to the embedder's probe
    # (a configuration error, exit 2) must not stand in for the Redis that does not answer
    env = {"STOKER_REDIS_URL": "redis://127.0.0.1:1", "STOKER_EMBEDDER": "openai",
           "STOKER_EMBEDDER_URL": sim.url, "STOKER_EMBEDDER_DIM": "384"}  # fmt: skip
    res = _stoker(["warm", "--dry-run"], env)
    assert res.returncode == 1 and "error" in res.stderr


def test_warm_cli__json_prints_every_item_and_every_candidate_left_out_with_its_value(
    redis_client: redis.Redis, redis_url: str, sim: SimulatorThread, tmp_path: Path
) -> None:
    # Two queries asked at 10:00 every weekday, and fillers asked once each at every hour.
    fill(
        TrafficProfile(redis_client),
        _week("acme", {"what is my balance": 20, "how do i reset my pin": 12}, {}),
    )
    env = _env(redis_url, sim, tmp_path)
    # Without a named budget, the scheduler's rule: only what pays for its send. The two are
    # asked for sure, sent at 09:00 (4 requests of the 10:00 peak's 36, and the first send
    # planned there one more for the second), each miss at the peak's price; the fillers,
    # asked once in a while, are worth less than their send.
    own = _stoker(["warm", "--window", WINDOW, "--dry-run", "--json"], env)
    assert own.returncode == 0, own.stderr
    plan = orjson.loads(own.stdout)
    items = plan["items"]
    assert plan["named_budget"] is False
    assert {i["query"] for i in items} == {"what is my balance", "how do i reset my pin"}
    sends = sorted(i["price_send"] for i in items)
    assert sends == pytest.approx([0.2 + 0.8 * 4 / 36, 0.2 + 0.8 * 5 / 36], rel=0.02)
    for i in items:
        assert i["value_ms"] > 0 and i["kept"]
        assert i["p_asked"] == pytest.approx(1.0, abs=1e-3)
        assert i["price_window"] > 0.95
        assert i["send_at"] == "2026-11-09T09:00:00+00:00"
    below = [o for o in plan["left_out"] if o["reason"].startswith("below break-even")]
    assert below and all(o["query"].startswith(("filler", "q:")) for o in below)
    assert f"{len(below)} below break-even" in plan["unused_reason"]
    # A named budget of 50 is spent past break-even on the best, down to the floor: the two
    # first, then the fillers, each with the chance it is asked in the window
    named = _stoker(
        ["warm", "--window", WINDOW, "--budget-requests", "50", "--dry-run", "--json"], env
    )
    assert named.returncode == 0, named.stderr
    plan = orjson.loads(named.stdout)
    items = plan["items"]
    assert plan["named_budget"] is True
    assert {i["query"] for i in items[:2]} == {"what is my balance", "how do i reset my pin"}
    assert all(i["query"].startswith("filler") for i in items[2:])
    assert all(i["p_asked"] >= 0.001 for i in items) and len(items) > 2
    floor = [o for o in plan["left_out"] if o["reason"].startswith("below the floor")]
    n = len(items)
    assert plan["spent"] == n and plan["unused"] == 50 - n
    if n < 50:  # what the budget could not buy is said, with the rule that left it out
        assert floor and f"{len(floor)} below the floor" in plan["unused_reason"]


def test_warm_cli__nothing_learned_says_why_and_what_to_do_next_in_one_line(
    redis_client: redis.Redis, redis_url: str, sim: SimulatorThread, tmp_path: Path
) -> None:
    """A newcomer's first `stoker warm --dry-run`, before any log was replayed: no empty
    table, but the cause and the verb that fixes it, on one line."""
    env = _env(redis_url, sim, tmp_path) | {"COLUMNS": "300"}
    dry = _stoker(["warm", "--dry-run"], env)
    assert dry.returncode == 0, dry.stderr
    (line,) = [x for x in dry.stderr.splitlines() if x.startswith("nothing to warm")]
    assert "holds no request of the window's hours on the days before today" in line
    assert "stoker replay LOG" in line
    assert "┏" not in dry.stderr


def test_warm_cli__an_empty_plan_below_break_even_names_a_budget_or_a_window() -> None:
    window = Window.parse(WINDOW)
    below = Skipped("acme", "q:1", "below break-even (asked with p 0.10 at most)")
    own = nothing_to_warm(Plan(window, Budget(requests=500), skipped=[below], volume={"acme": 40}))
    assert "none does in this window" in own
    assert "--budget-requests 10" in own and "--window START..END" in own
    cached = Skipped("acme", "q:1", "cached (60 s left)")
    named = Plan(window, Budget(requests=5), skipped=[cached], volume={"acme": 40}, named=True)
    assert nothing_to_warm(named) == (
        "nothing to warm: --json lists every candidate with why it was left out"
    )
