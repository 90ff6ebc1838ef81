"""The import-linter layer contract holds, and covers every package stoker ships."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_layers__every_shipped_package_is_a_root_and_a_layer():
    doc = _pyproject()
    shipped = set(doc["tool"]["setuptools"]["packages"])
    linter = doc["tool"]["importlinter"]
    (contract,) = [c for c in linter["contracts"] if c["type"] == "layers"]
    layered = {m for layer in contract["layers"] for m in re.findall(r"\w+", layer)}
    assert shipped == set(linter["root_packages"])
    assert shipped <= layered


def test_layers__the_contract_holds():
    lint = Path(sys.executable).parent / "lint-imports"
    out = subprocess.run([str(lint)], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
    assert "1 kept, 0 broken" in out.stdout
