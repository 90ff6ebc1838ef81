"""The newcomer's warming path of docs/warming.md, walked as written: `stoker sample-log
--gateway`, `stoker replay` into Kafka (Tansu), the traffic worker, `stoker warm --dry-run` and
`stoker warm` (subprocesses, as a user runs them, against the simulated backend), then the
warmed questions asked through the gateway with the openai SDK: hits a warm filled."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pandas as pd
import redis

from simulation.backend.http import SimulatorThread
from stoker.wiring import worker_config
from streams.worker import Worker
from tests.cli import run_stoker
from tests.gateway.conftest import GatewayFactory, client, stack_of
from warmers.traffic.profile import TrafficProfile
from warmers.traffic.worker import TrafficHandler

MODEL = "sim-model"
BUDGET = 5


def _plan(env: dict[str, str], *args: str) -> dict[str, Any]:
    """`stoker warm --budget-requests BUDGET --json ARGS`: its JSON (exit 0, or fail)."""
    done = run_stoker("warm", "--budget-requests", str(BUDGET), "--json", *args, env=env)
    assert done.returncode == 0, done.stderr
    out: dict[str, Any] = orjson.loads(done.stdout)
    return out


def test_try_warming__a_replayed_sample_log_plans_warms_and_its_warms_are_hits(
    make_gateway: GatewayFactory,
    sim: SimulatorThread,
    kafka_bootstrap: str,
    redis_url: str,
    redis_client: redis.Redis,
    unique: str,
    tmp_path: Path,
) -> None:
    prefix = f"try{unique}."
    gw = make_gateway(
        sim.url, kafka_bootstrap=kafka_bootstrap, kafka_broker="tansu", topic_prefix=prefix
    )
    env = {
        "STOKER_KAFKA_BOOTSTRAP": kafka_bootstrap, "STOKER_KAFKA_BROKER": "tansu",
        "STOKER_TOPIC_PREFIX": prefix, "STOKER_REDIS_URL": redis_url,
        "STOKER_WARM_BACKEND_URL": sim.url,
        "STOKER_QDRANT_PATH": str(tmp_path / "warm-qdrant"),  # the gateway holds its own Edge
    }  # fmt: skip
    log = tmp_path / "sample.parquet"
    made = run_stoker("sample-log", "--gateway", "--model", MODEL, "--days", "7",
                      "--per-day", "300", "--out", str(log), env=env)  # fmt: skip
    assert made.returncode == 0, made.stderr
    rows = len(pd.read_parquet(log))
    replayed = run_stoker("replay", str(log), env=env)
    assert replayed.returncode == 0, replayed.stderr
    handler = TrafficHandler(TrafficProfile(redis_client))
    learn = worker_config(stack_of(gw).settings, handler, f"g{unique}")
    assert Worker(handler, learn).run_until(lambda st: st.events >= rows, 30)

    dry = _plan(env, "--dry-run")
    assert len(dry["items"]) == BUDGET and dry["named_budget"]
    assert all(i["model_id"] == MODEL and i["kept"] for i in dry["items"])
    assert sim.stats().served == 0  # a dry run sends nothing

    warmed = _plan(env, "--qps", "50")
    assert warmed["run"]["sent"] == BUDGET == sim.stats().served
    landed = [i for i in warmed["items"] if i["landed"]]
    assert len(landed) == warmed["run"]["cached"] >= 1

    for item in landed:  # asked as the docs' snippet asks: what a client of the gateway sends
        r = client(gw, tenant=item["tenant"]).chat.completions.with_raw_response.create(
            model=MODEL, temperature=0, max_tokens=512,
            messages=[{"role": "user", "content": item["query"]}],
        )  # fmt: skip
        assert (r.headers["x-stoker-cache"], r.headers["x-stoker-source"]) == ("exact", "warm")
    assert sim.stats().served == BUDGET  # every answer came from the warmed cache
