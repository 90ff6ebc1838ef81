"""The import-linter layer contract holds, and covers every package stoker ships; the model server
is reached through backends/ alone."""

from __future__ import annotations

import ast
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
    include = doc["tool"]["setuptools"]["packages"]["find"]["include"]
    shipped = {p.removesuffix("*") for p in include}
    linter = doc["tool"]["importlinter"]
    (contract,) = [c for c in linter["contracts"] if c.get("id") == "layers"]
    layered = {m for layer in contract["layers"] for m in re.findall(r"\w+", layer)}
    assert shipped == set(linter["root_packages"])
    assert shipped <= layered


def test_layers__the_contract_holds():
    lint = Path(sys.executable).parent / "lint-imports"
    out = subprocess.run([str(lint)], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
    contracts = len(_pyproject()["tool"]["importlinter"]["contracts"])
    assert f"{contracts} kept, 0 broken" in out.stdout


# What a module of the middle layer would import to speak HTTP to a model server itself.
HTTP_CLIENTS = frozenset({"aiohttp", "httpx", "requests", "urllib3", "urllib.request"})


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), str(path))
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module)
    return out


def test_layers__backends_sit_below_the_gateway_the_warmers_and_the_invalidators():
    (contract,) = [
        c for c in _pyproject()["tool"]["importlinter"]["contracts"] if c.get("id") == "layers"
    ]
    layers = contract["layers"]
    assert layers.index("gateway | warmers | invalidators | audits | simulation") < layers.index(
        "backends"
    )
    assert layers.index("backends") < layers.index("streams")


def test_layers__only_backends_speak_http_to_a_model_server():
    """One client (backends/client.py) for the gateway's proxy, the warmers, the monitor and
    the prefix warm: none of them imports an HTTP library of its own."""
    offenders = {
        str(path.relative_to(ROOT)): sorted(
            m for m in _imports(path) if m in HTTP_CLIENTS or m.split(".")[0] in HTTP_CLIENTS
        )
        for package in ("gateway", "warmers", "invalidators", "audits", "simulation")
        for path in sorted((ROOT / package).rglob("*.py"))
    }
    assert {k: v for k, v in offenders.items() if v} == {}
