"""Helpers for the deploy/ tests: file paths and the settings' env names."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from stoker.settings import StokerSettings

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
ENV_PREFIX = "STOKER_"


def load_yaml(path: Path) -> Any:
    return yaml.safe_load(path.read_text())


def unknown_settings(env: dict[str, Any]) -> list[str]:
    """STOKER_* names that are not StokerSettings fields (a typo fails at start in production)."""
    return [
        k
        for k in env
        if k.startswith(ENV_PREFIX)
        and k[len(ENV_PREFIX) :].lower() not in StokerSettings.model_fields
    ]


def settings_from(env: dict[str, Any]) -> StokerSettings:
    """Validate values as the process would read them (types, Literal choices, ranges)."""
    fields = {k[len(ENV_PREFIX) :].lower(): v for k, v in env.items() if k.startswith(ENV_PREFIX)}
    return StokerSettings.model_validate(fields)
