"""Deploy pre-warm: the old version's hot set lands in the new version's namespace only."""

from __future__ import annotations

from datetime import timedelta

import redis

from caches.client import CacheClient
from caches.policy import CachePolicy
from tests.warmers.hotset_helpers import WordsEmbedder, fill
from tests.warmers.test_hotset import MONDAY, _week
from warmers.backends.base import Backend
from warmers.backends.openai import OpenAIBackend, RetryPolicy
from warmers.backends.simhttp import SimulatorThread
from warmers.budget import Budget
from warmers.hotset import HotSetConfig, HotSetSelector
from warmers.prewarm import HotSetPrewarmer
from warmers.profile import TrafficProfile
from warmers.runner import WarmRunner
from warmers.shadow import WarmConfig
from warmers.window import Window


def test_prewarm__warms_the_new_version_with_the_old_versions_hot_set(
    redis_client: redis.Redis, sim: SimulatorThread
) -> None:
    profile = TrafficProfile(redis_client)
    fill(profile, _week("acme", {"what is my balance": 20, "reset my pin": 12}, {}))
    fill(profile, _week("globex", {"where is my parcel": 15}, {}))
    cache = CacheClient(redis_client, policy=CachePolicy(exact_ttl_s=600))
    # entries live 600 s here: a 60 s bar keeps them fresh for the second run
    selector = HotSetSelector(profile, WordsEmbedder(), config=HotSetConfig(min_ttl_left_s=60))

    def backend() -> Backend:
        return OpenAIBackend(sim.url, retry=RetryPolicy(attempts=1))

    runner = WarmRunner(
        selector, cache, backend, WarmConfig(target_qps=200, capacity_qps=1000, ramp_s=0, min_ttl_left_s=60),
        progress=False,
    )  # fmt: skip
    start = MONDAY + timedelta(days=7, hours=10)
    pw = HotSetPrewarmer(  # the cutover's Prewarmer (mypy checks it where demo/ wires it)
        runner, Budget(requests=2), window=lambda: Window(start, start + timedelta(hours=1))
    )
    res = pw.prewarm("m", "v2", "v1", ["acme"])
    assert (res.planned, res.sent, res.cached, res.failed) == (2, 2, 2, 0) and res.ok
    assert len(redis_client.keys("stk:{t:acme}:e:m@v2:*")) == 2
    assert redis_client.keys("stk:{t:acme}:e:m@v1:*") == []  # the old namespace is untouched
    assert redis_client.keys("stk:{t:globex}:e:*") == []  # only the tenants asked for
    again = pw.prewarm("m", "v2", "v1", ["acme"])
    assert again.sent == 0 and again.ok  # already warm: nothing to send
    assert pw.prewarm("other-model", "v9", "v8", []).planned == 0
