"""One source for each default: a setting that points at an owner's field cannot differ from
it (default, type, bounds), every owner field is a setting or declared owner-only, and every
setting has an owner or belongs to the shell alone (stoker/options.py)."""

from __future__ import annotations

import pytest

from caches.policy import CachePolicy
from gateway.options import GatewayOptions
from schemas.errors import UsageError
from stoker.options import OWNER_ONLY, OWNERS, SHELL_ONLY, origins
from stoker.settings import StokerSettings
from streams.worker import WorkerConfig
from warmers.hotset.options import HotSetConfig
from warmers.prefix.warm import PrefixWarmOptions
from warmers.shadow import WarmConfig

# Owner fields without a default: what options() must be given.
REQUIRED: dict[type, dict[str, object]] = {
    GatewayOptions: {"upstream_url": "http://up"},
    PrefixWarmOptions: {"backend_url": None},
    WorkerConfig: {"bootstrap": "kafka:9092", "group_id": "g"},
}


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    for name in list(os.environ):
        if name.upper().startswith("STOKER_"):
            monkeypatch.delenv(name)


def test_options__every_setting_that_points_at_an_owner_has_its_default_type_and_bounds():
    found = origins(StokerSettings)
    assert found, "no setting points at an owner"
    for flat, (owner, name) in found.items():
        mine, theirs = StokerSettings.model_fields[flat], owner.model_fields[name]
        assert mine.get_default(call_default_factory=True) == theirs.get_default(
            call_default_factory=True
        ), flat
        assert mine.annotation == theirs.annotation, flat
        assert mine.metadata == theirs.metadata, flat  # ge/gt/le/lt


def test_options__every_owner_field_is_a_setting_or_declared_owner_only():
    found = origins(StokerSettings)
    assert set(OWNER_ONLY) == set(OWNERS)
    for owner in OWNERS:
        exposed = {n for o, n in found.values() if o is owner}
        assert not exposed & OWNER_ONLY[owner], owner.__name__
        assert set(owner.model_fields) == exposed | OWNER_ONLY[owner], owner.__name__


def test_options__every_setting_has_an_owner_or_is_shell_only():
    fields, owned = set(StokerSettings.model_fields), set(origins(StokerSettings))
    assert fields >= SHELL_ONLY, SHELL_ONLY - fields
    assert not SHELL_ONLY & owned, SHELL_ONLY & owned
    assert fields == owned | SHELL_ONLY, fields ^ (owned | SHELL_ONLY)


@pytest.mark.usefixtures("clean_env")
def test_options__built_from_defaults_equals_the_owners_defaults():
    s = StokerSettings()
    for owner in OWNERS:
        assert s.options(owner, **REQUIRED.get(owner, {})) == owner(**REQUIRED.get(owner, {}))


@pytest.mark.usefixtures("clean_env")
def test_options__environment_reaches_the_owner_and_its_bounds_fail_at_start(
    monkeypatch: pytest.MonkeyPatch,
):
    monkeypatch.setenv("STOKER_SEMANTIC_THRESHOLD", "0.8")
    monkeypatch.setenv("STOKER_CONSERVATIVE_ROUTES", '["*/medical"]')
    monkeypatch.setenv("STOKER_ROUTE_THRESHOLDS__acme/legal", "0.99")
    pol = StokerSettings().options(CachePolicy)
    assert pol.threshold == 0.8 and pol.conservative_routes == frozenset({"*/medical"})
    assert pol.threshold_for("acme", "legal") == 0.99
    assert pol.threshold_for("acme", "medical") == 0.95  # the conservative bar wins over 0.8
    monkeypatch.setenv("STOKER_EXACT_TTL_S", "0")  # the owner's gt=0, copied: fails at start
    with pytest.raises(UsageError, match="STOKER_EXACT_TTL_S='0'"):
        StokerSettings()


@pytest.mark.usefixtures("clean_env")
def test_options__an_override_wins_and_is_validated_by_the_owner():
    s = StokerSettings(semantic_threshold=0.9)
    assert s.options(CachePolicy, threshold=0.7).threshold == 0.7
    assert s.options(CachePolicy).threshold == 0.9
    with pytest.raises(ValueError, match="less than or equal to 1"):
        s.options(CachePolicy, threshold=1.5)


@pytest.mark.usefixtures("clean_env")
def test_options__a_planner_built_without_settings_plans_for_the_gateways_matcher():
    """HotSetConfig() once planned for "static" while the gateways served "verified": a hot
    set built without wiring (a test, a benchmark, a tool) merged paraphrases no served entry
    would vouch for. The owner now holds the one default."""
    assert HotSetConfig().matcher == StokerSettings().semantic_matcher == "verified"


def test_options__the_shadow_warmer_defaults_to_the_planners_ttl_bar_and_idle_price():
    """WarmConfig's TTL bar and idle price are the planner's settings (HotSetConfig owns
    them): a shadow warmer built without settings must re-warm and price as the plan did."""
    warm, plan = WarmConfig(), HotSetConfig()
    assert (warm.min_ttl_left_s, warm.idle_price) == (plan.min_ttl_left_s, plan.idle_price)
