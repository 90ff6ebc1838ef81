"""The handler registry and the `stoker worker` verb's exit codes."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from schemas.errors import ConfigError
from schemas.events import Event
from stoker import registry
from stoker.cli import app
from stoker.settings import StokerSettings
from stoker.stack import Stack
from streams.base import Handler
from warmers.traffic.worker import TrafficHandler

runner = CliRunner()


class Nop(Handler):
    name = "nop"
    topics = ["stoker.status"]  # noqa: RUF012

    def apply(self, events: list[Event]) -> None:
        return None


def test_registry__traffic_is_built_in(redis_url: str) -> None:
    with Stack(StokerSettings(redis_url=redis_url)) as stack:
        handler = registry.build_handler("traffic", stack)
        try:
            assert isinstance(handler, TrafficHandler)
            assert handler.topics == ["inference.requests"]
        finally:
            handler.close()


def test_registry__register_and_unregister() -> None:
    registry.register("extra", lambda _s: Nop())
    try:
        assert "extra" in registry.available()
        assert isinstance(registry.build_handler("extra", Stack(StokerSettings())), Nop)
    finally:
        registry.unregister("extra")
    assert "extra" not in registry.available()


def test_registry__known_name_without_factory_is_not_available() -> None:
    with pytest.raises(registry.HandlerNotAvailable, match="not available yet"):
        registry.factory_for("no-such-worker")


def test_worker_cli__unknown_name_exits_2() -> None:
    result = runner.invoke(app, ["worker", "bogus", "--bootstrap", "127.0.0.1:1"])
    assert result.exit_code == 2


def test_worker_cli__bad_broker_kind_exits_2() -> None:
    result = runner.invoke(app, ["worker", "traffic", "--bootstrap", "x:1", "--broker", "pulsar"])
    assert result.exit_code == 2


def test_worker_cli__unbuilt_worker_exits_1(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(registry, "_BUILTIN", {"traffic": registry._BUILTIN["traffic"]})
    result = runner.invoke(app, ["worker", "deploy", "--bootstrap", "127.0.0.1:1"])
    assert result.exit_code == 1
    assert isinstance(result.exception, registry.HandlerNotAvailable)


def test_registry__scheduler_is_a_service_listed_for_all() -> None:
    assert registry.is_service("scheduler")
    assert "scheduler" in registry.available()
    assert not registry.is_service("traffic")


def test_registry__the_monitor_joins_all_only_with_the_verified_matcher() -> None:
    assert "monitor" not in registry.available()
    static = StokerSettings(semantic_matcher="static")
    assert "monitor" not in registry.available(static)
    assert registry.opted_out(static) == ["monitor"]
    verified = StokerSettings()  # the default matcher
    assert verified.semantic_matcher == "verified"
    assert "monitor" in registry.available(verified) and registry.opted_out(verified) == []
    assert registry.factory_for("monitor") is registry.monitor_handler  # `worker monitor` runs


def test_registry__the_scheduler_warms_prefixes_before_the_peak_unless_turned_off(
    redis_url: str, qdrant_path: Path
) -> None:
    from warmers.prefix.before_peak import PeakPrefixWarm

    base = {"redis_url": redis_url, "qdrant_path": qdrant_path, "embedder_dim": 384,
            "warm_backend_url": "http://gpu-0:8000/v1"}  # fmt: skip
    with Stack(StokerSettings(**base)) as stack:
        on = registry.build_service("scheduler", stack)
        job = on.scheduler.prefixes  # type: ignore[attr-defined]
        assert isinstance(job, PeakPrefixWarm) and job.lead_s == 1800
    with Stack(StokerSettings(**base, prefix_warm_before_peak_s=0)) as stack:
        off = registry.build_service("scheduler", stack)
        assert off.scheduler.prefixes is None  # type: ignore[attr-defined]


def test_registry__the_scheduler_watches_the_listed_replicas_only(
    redis_url: str, qdrant_path: Path
) -> None:
    from warmers.prefix.after_restart import ReplicaWatch

    base = {"redis_url": redis_url, "qdrant_path": qdrant_path, "embedder_dim": 384,
            "warm_backend_url": "http://gpu-0:8000/v1"}  # fmt: skip
    fleet = {"llama": ["http://vllm-0:8000", "http://vllm-1:8000"]}
    watched = StokerSettings(**base, prefix_warm_replicas=fleet, prefix_warm_replica_check_s=12)
    with Stack(watched) as stack:
        on = registry.build_service("scheduler", stack)
        job = on.scheduler.replicas  # type: ignore[attr-defined]
        assert isinstance(job, ReplicaWatch) and job.replicas == fleet
        assert on.scheduler.cfg.replica_check_s == 12  # type: ignore[attr-defined]
    with Stack(StokerSettings(**base)) as stack:
        off = registry.build_service("scheduler", stack)
        assert off.scheduler.replicas is None  # type: ignore[attr-defined]


def test_registry__the_rewarm_worker_runs_in_all_on_the_kb_changes() -> None:
    assert "rewarm" in registry.available()
    assert registry.factory_for("rewarm") is registry.rewarm_handler


def test_registry__a_worker_that_warms_needs_a_model_server_named(
    redis_url: str, qdrant_path: Path
) -> None:
    """With Kafka configured (no embedded stack) and no model server set, a worker that warms
    refuses at start in one line naming both settings, rather than warming a default address."""
    s = StokerSettings(redis_url=redis_url, qdrant_path=qdrant_path, embedder_dim=384)
    with (
        Stack(s) as stack,
        pytest.raises(ConfigError, match="STOKER_GATEWAY_UPSTREAM_URL or STOKER_WARM_BACKEND_URL"),
    ):
        registry.build_service("scheduler", stack)


def test_registry__the_invalidation_worker_purges_at_the_deploy_purge_settings(
    redis_client: object, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The worker once built PurgeOptions() whatever STOKER_DEPLOY_PURGE_* said: a template
    change then purged in batches of 1,000 at full speed on a site that had set them lower."""
    from caches.request import CacheRequest
    from invalidators.handlers import InvalidationHandler
    from schemas.events import PromptTemplateChanged

    monkeypatch.setenv("STOKER_DEPLOY_PURGE_BATCH", "2")
    s = StokerSettings(redis_url=redis_url)
    stack = Stack(s)
    cache = stack.exact_cache
    for i in range(12):
        q = CacheRequest(tenant="acme", model_id="llama", model_version="v1",
                         template_version="t1", prompt=f"question {i}")  # fmt: skip
        assert cache.store(cache.lookup(q), f"answer {i}").landed
    handler = registry.build_handler("invalidation", stack)
    try:
        assert isinstance(handler, InvalidationHandler)
        ev = PromptTemplateChanged(
            tenant="acme", model_id="llama", old_template_version="t1", new_template_version="t2"
        )
        done = handler.invalidator.template_changed(ev)
    finally:
        handler.close()
        stack.close()
    assert done.deleted == 12
    # at 1,000 keys a batch, the dozen go in one SCAN and one UNLINK; at the setting's two,
    # SCAN's COUNT hint stops each batch after a few buckets
    assert done.batches > 1
