"""Settings: env vars, frozen, typos fail at start, and every field is read somewhere."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from pydantic import ValidationError

from stoker.settings import StokerSettings
from stoker.wiring import policy_from

ROOT = Path(__file__).resolve().parents[2]


def test_settings__read_from_env(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("STOKER_REDIS_URL", "redis://cache:6379/2")
    monkeypatch.setenv("STOKER_TENANT_THRESHOLDS", '{"acme": 0.97}')
    s = StokerSettings()
    assert s.redis_url == "redis://cache:6379/2"
    pol = policy_from(s)
    assert pol.threshold_for("acme") == 0.97 and pol.threshold_for("other") == 0.92


def test_settings__unknown_field_fails_at_start():
    with pytest.raises(ValidationError, match="redis_ulr"):
        StokerSettings(redis_ulr="redis://typo")  # type: ignore[call-arg]


def test_settings__frozen_and_validated():
    s = StokerSettings()
    with pytest.raises(ValidationError):
        s.redis_url = "x"  # type: ignore[misc]
    with pytest.raises(ValidationError, match="thresholds"):
        StokerSettings(tenant_thresholds={"acme": 1.5})


def test_settings__every_field_is_read_by_the_code():
    """A setting nobody reads is a lie in the docs; each must be used in the shell (the only
    place that reads settings: the packages below it take plain options)."""
    source = "\n".join(
        p.read_text() for p in (ROOT / "stoker").rglob("*.py") if p.name != "settings.py"
    )
    unread = [f for f in StokerSettings.model_fields if not re.search(rf"\.{f}\b", source)]
    assert unread == []
