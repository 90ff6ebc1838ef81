"""Settings: env vars, frozen, typos fail at start, and every field is read somewhere."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from pydantic import ValidationError

from caches.policy import CachePolicy
from schemas.errors import UsageError
from stoker.options import origins
from stoker.settings import StokerSettings
from tests.cli import run_stoker

ROOT = Path(__file__).resolve().parents[2]


def test_settings__read_from_env(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("STOKER_REDIS_URL", "redis://cache:6379/2")
    monkeypatch.setenv("STOKER_TENANT_THRESHOLDS", '{"acme": 0.97}')
    s = StokerSettings()
    assert s.redis_url == "redis://cache:6379/2"
    pol = s.options(CachePolicy)
    assert pol.threshold_for("acme") == 0.97 and pol.threshold_for("other") == 0.92


def test_settings__unknown_field_fails_at_start():
    with pytest.raises(UsageError, match="STOKER_REDIS_ULR"):
        StokerSettings(redis_ulr="redis://typo")  # type: ignore[call-arg]


def test_settings__frozen_and_validated():
    s = StokerSettings()
    with pytest.raises(ValidationError):
        s.redis_url = "x"  # type: ignore[misc]
    with pytest.raises(UsageError, match=re.escape("STOKER_TENANT_THRESHOLDS__acme=1.5")):
        StokerSettings(tenant_thresholds={"acme": 1.5})


def test_settings__unknown_env_variable_fails_with_the_closest_name(
    monkeypatch: pytest.MonkeyPatch,
):
    monkeypatch.setenv("STOKER_SEMANTIC_THRESHOLDS", "0.5")
    with pytest.raises(UsageError, match=re.escape("did you mean STOKER_SEMANTIC_THRESHOLD?")):
        StokerSettings()
    monkeypatch.delenv("STOKER_SEMANTIC_THRESHOLDS")
    monkeypatch.setenv("STOKER_BOGUS", "1")
    with pytest.raises(
        UsageError, match=re.escape("unknown setting STOKER_BOGUS: see stoker/settings.py")
    ):
        StokerSettings()


def test_settings__nested_dict_variables_and_the_data_dir_are_known(
    monkeypatch: pytest.MonkeyPatch,
):
    monkeypatch.setenv("STOKER_TENANT_THRESHOLDS__acme", "0.97")  # env_nested_delimiter "__"
    monkeypatch.setenv("STOKER_DATA_DIR", "/nowhere")  # a setting: stoker/data.py reads it
    s = StokerSettings()
    assert s.tenant_thresholds == {"acme": 0.97}
    assert s.data_dir == Path("/nowhere")


def test_settings__tenant_ids_follow_the_events_rule():
    for bad in (" ", "a{b}", "x" * 129):
        with pytest.raises(UsageError, match="STOKER_GATEWAY_DEFAULT_TENANT"):
            StokerSettings(gateway_default_tenant=bad)


@pytest.mark.parametrize(
    ("variable", "value", "says"),
    [
        ("STOKER_WARM_VALUE_MODEL", "top-k", "Input should be 'prevented' or 'hits'"),
        ("STOKER_WARM_IDLE_PRICE", "1.5", "Input should be less than or equal to 1"),
        ("STOKER_WARM_IDLE_PRICE", "-0.1", "Input should be greater than or equal to 0"),
        ("STOKER_WARM_LATENCY_WEIGHT", "-1", "Input should be greater than or equal to 0"),
    ],
)
def test_settings__the_warm_value_model_and_its_prices_are_validated(
    monkeypatch: pytest.MonkeyPatch, variable: str, value: str, says: str
):
    monkeypatch.setenv(variable, value)
    with pytest.raises(UsageError, match=re.escape(f"{variable}='{value}': {says}")):
        StokerSettings()


def test_settings__warm_value_model_defaults_to_the_miss_prevented(
    monkeypatch: pytest.MonkeyPatch,
):
    for name in ("STOKER_WARM_VALUE_MODEL", "STOKER_WARM_IDLE_PRICE", "STOKER_WARM_LATENCY_WEIGHT"):
        monkeypatch.delenv(name, raising=False)  # the defaults, whatever the shell has set
    s = StokerSettings()
    assert (s.warm_value_model, s.warm_idle_price, s.warm_latency_weight) == ("prevented", 0.2, 0)
    monkeypatch.setenv("STOKER_WARM_VALUE_MODEL", "hits")
    monkeypatch.setenv("STOKER_WARM_IDLE_PRICE", "0")
    monkeypatch.setenv("STOKER_WARM_LATENCY_WEIGHT", "2.5")
    s = StokerSettings()
    assert (s.warm_value_model, s.warm_idle_price, s.warm_latency_weight) == ("hits", 0.0, 2.5)


@pytest.mark.parametrize(
    ("variable", "says"),
    [
        ("STOKER_SEMANTIC_THRESHOLD=2", "STOKER_SEMANTIC_THRESHOLD='2': Input should be less"),
        ("STOKER_SEMANTIC_THRESHOLDS=0.5", "did you mean STOKER_SEMANTIC_THRESHOLD?"),
        ("STOKER_BOGUS=1", "unknown setting STOKER_BOGUS"),
        ("STOKER_DEPLOY_PREWARM_HOURS=0", "STOKER_DEPLOY_PREWARM_HOURS='0': Input should be"),
        ("STOKER_DEPLOY_PREWARM_HIT_BAR=1.5", "STOKER_DEPLOY_PREWARM_HIT_BAR='1.5': Input should"),
    ],
)
def test_cli__a_bad_or_unknown_setting_is_one_line_and_exit_2(variable: str, says: str):
    name, value = variable.split("=")
    res = run_stoker("status", env={name: value, "STOKER_REDIS_URL": "redis://127.0.0.1:1"})
    assert res.returncode == 2, res.stderr
    assert "Traceback" not in res.stderr
    assert res.stderr.strip().count("\n") == 0 and says in res.stderr, res.stderr


def test_settings__every_field_is_read_by_the_code():
    """A setting nobody reads is a lie in the docs; each must be used in the shell (the only
    place that reads settings: the packages below it take plain options)."""
    source = "\n".join(
        p.read_text() for p in (ROOT / "stoker").rglob("*.py") if p.name != "settings.py"
    )
    # a setting that points at an owner is read by StokerSettings.options(Owner): the owner must
    # be built that way somewhere in the shell
    pointed = origins(StokerSettings)
    unread = [
        f
        for f in StokerSettings.model_fields
        if not re.search(rf"\.{f}\b", source)
        and not (f in pointed and re.search(rf"\.options\(\s*{pointed[f][0].__name__}\b", source))
    ]
    assert unread == []
