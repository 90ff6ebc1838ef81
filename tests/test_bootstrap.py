"""`make setup` is quiet: stoker's editable install, run through the build backend's hooks as pip
runs them, raises no warning under the filter scripts/bootstrap.sh sets (pip shows a backend's
warnings even with -q), and that filter is needed: without it setuptools' note is raised."""

from __future__ import annotations

import os
import re
import warnings
from pathlib import Path

from pip._vendor.pyproject_hooks import BuildBackendHookCaller, quiet_subprocess_runner

ROOT = Path(__file__).resolve().parents[1]


def _bootstrap_filter() -> str:
    """The PYTHONWARNINGS that scripts/bootstrap.sh gives its `pip install -e .`."""
    script = (ROOT / "scripts" / "bootstrap.sh").read_text()
    found = re.search(r'PYTHONWARNINGS="([^"]+)"\s*\\\s*\n[^\n]*pip install[^\n]* -e \.', script)
    assert found, "bootstrap.sh no longer filters its editable install's warnings"
    return found.group(1)


def _editable_install_warnings(tmp_path: Path, env: dict[str, str]) -> list[str]:
    """The first line of each warning pip would be handed by the backend's hooks."""

    def runner(
        cmd: list[str], cwd: str | None = None, extra_environ: dict[str, str] | None = None
    ) -> None:
        quiet_subprocess_runner(cmd, cwd, {**(extra_environ or {}), **env})

    hooks = BuildBackendHookCaller(str(ROOT), "setuptools.build_meta", runner=runner)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        hooks.get_requires_for_build_editable()
        hooks.prepare_metadata_for_build_editable(str(tmp_path / "meta"))
        hooks.build_editable(str(tmp_path / "wheel"))
    return [str(w.message).splitlines()[0] for w in caught]


def test_bootstrap__the_editable_install_warns_nothing_under_its_filter(tmp_path: Path) -> None:
    (tmp_path / "meta").mkdir()
    (tmp_path / "wheel").mkdir()
    unfiltered = {"PYTHONWARNINGS": os.environ.get("PYTHONWARNINGS", "")}
    assert _editable_install_warnings(tmp_path, unfiltered) == ["Editable installation."]
    filtered = {"PYTHONWARNINGS": _bootstrap_filter()}
    assert _editable_install_warnings(tmp_path, filtered) == []
