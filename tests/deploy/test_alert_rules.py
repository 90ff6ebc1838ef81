"""The alert rules' PromQL runs: promtool checks alerts.yml and runs its unit tests."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from tests.deploy.conftest import DEPLOY, load_yaml

RULES = DEPLOY / "prometheus" / "alerts.yml"
RULE_TESTS = DEPLOY / "prometheus" / "alerts_test.yml"
# Each must fire on a synthetic series and stay quiet on a healthy one (issue 15).
TESTED = (
    "StokerServedWrongAboveBudget",
    "StokerHitRateDropped",
    "StokerSchedulerLeaderMissing",
    "StokerUpstreamDown",
)
# promtool evaluates a few hundred synthetic minutes in well under a second.
TIMEOUT_S = 60


def promtool() -> str:
    """promtool on PATH; a missing one fails the test (CI must run these, never skip them)."""
    path = shutil.which("promtool")
    if path is None:
        pytest.fail(
            "promtool is not on PATH. `make setup` (scripts/bootstrap.sh) installs it; by hand: "
            "sudo apt-get install -y prometheus (Debian/Ubuntu ship promtool in that package), "
            "or put promtool from https://prometheus.io/download/ on PATH.",
            pytrace=False,
        )
    return path


def run(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [promtool(), *map(str, args)], capture_output=True, text=True, timeout=TIMEOUT_S
    )


def output(done: subprocess.CompletedProcess[str]) -> str:
    return f"promtool exited {done.returncode}\n{done.stdout}{done.stderr}"


def test_alert_rules__promtool_check_rules_passes():
    done = run("check", "rules", RULES)
    assert done.returncode == 0, output(done)


def test_alert_rules__promtool_unit_tests_pass():
    done = run("test", "rules", RULE_TESTS)
    assert done.returncode == 0, output(done)


def test_alert_rules__each_tested_alert_fires_and_stays_quiet():
    """alerts_test.yml holds, for each alert of TESTED, a case it fires in and one it does not."""
    cases = [c for t in load_yaml(RULE_TESTS)["tests"] for c in t["alert_rule_test"]]
    rules = {r["alert"] for g in load_yaml(RULES)["groups"] for r in g["rules"]}
    for alert in TESTED:
        assert alert in rules
        mine = [c for c in cases if c["alertname"] == alert]
        assert any(c["exp_alerts"] for c in mine), f"{alert} never fires in {RULE_TESTS.name}"
        assert any(not c["exp_alerts"] for c in mine), f"{alert} is never quiet"


def test_alert_rules__a_broken_rule_fails_the_unit_tests(tmp_path: Path):
    """The check itself can fail: a bound equal to the budget must not fire."""
    rules = RULES.read_text()
    strict = "> on (tenant, route)"
    assert rules.count(strict) == 1
    (tmp_path / RULES.name).write_text(rules.replace(strict, ">= on (tenant, route)"))
    shutil.copy(RULE_TESTS, tmp_path / RULE_TESTS.name)
    done = run("test", "rules", tmp_path / RULE_TESTS.name)
    assert done.returncode != 0, output(done)
    assert 'tenant="globex"' in output(done)  # the boundary case, bound == budget
