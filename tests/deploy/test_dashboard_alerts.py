"""The Grafana dashboard and the alert rules reference only metrics stoker registers."""

from __future__ import annotations

import json
import re
from typing import Any

from prometheus_client import REGISTRY

from stoker.metrics import register_all
from tests.deploy.conftest import DEPLOY, load_yaml

DASHBOARD = DEPLOY / "grafana" / "dashboards" / "stoker.json"
ALERTS = DEPLOY / "prometheus" / "alerts.yml"
NAME = re.compile(r"\bstoker_[a-z0-9_]+")
# The series names a family exposes, by type (a labelled family with no child yet has no
# samples, so names come from the type, not from collect()'s samples).
SUFFIXES = {
    "counter": ("_total",),
    "gauge": ("",),
    "histogram": ("_bucket", "_count", "_sum"),
    "summary": ("", "_count", "_sum"),
}


def exposed() -> dict[str, str]:
    """Series name -> family name, for every stoker family in the default registry."""
    register_all()
    out = {}
    for family in REGISTRY.collect():
        if family.name.startswith("stoker_"):
            for suffix in SUFFIXES[family.type]:
                out[family.name + suffix] = family.name
    return out


def dashboard_exprs() -> list[str]:
    dash = json.loads(DASHBOARD.read_text())
    return [t["expr"] for p in dash["panels"] for t in p.get("targets", [])]


def alert_rules() -> list[dict[str, Any]]:
    return [r for g in load_yaml(ALERTS)["groups"] for r in g["rules"]]


def test_dashboard__every_referenced_metric_exists():
    names = exposed()
    used = {m for e in dashboard_exprs() for m in NAME.findall(e)}
    assert used and sorted(used - set(names)) == []


def test_dashboard__shows_every_stoker_family():
    names = exposed()
    shown = {names[m] for e in dashboard_exprs() for m in NAME.findall(e) if m in names}
    assert sorted(set(names.values()) - shown) == []


def test_dashboard__unique_panel_ids_and_the_provisioned_datasource():
    dash = json.loads(DASHBOARD.read_text())
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids)) and dash["uid"] == "stoker"
    ds = load_yaml(DEPLOY / "grafana" / "provisioning" / "datasources" / "prometheus.yml")
    uid = ds["datasources"][0]["uid"]
    for p in dash["panels"]:
        for t in p.get("targets", []):
            assert t["datasource"]["uid"] == uid, p["title"]


def test_alerts__the_four_required_rules_on_existing_metrics():
    names = exposed()
    rules = {r["alert"]: r for r in alert_rules()}
    required = {
        "StokerHitRateDropped": "stoker_gateway_requests_total",
        "StokerInvalidationLagHigh": "stoker_invalidation_lag_seconds_bucket",
        "StokerDeadLettersGrowing": "stoker_worker_dead_letters_total",
        "StokerSchedulerLeaderMissing": "stoker_scheduler_leader",
    }
    for alert, metric in required.items():
        assert metric in rules[alert]["expr"], alert
    for r in rules.values():
        assert sorted(set(NAME.findall(r["expr"])) - set(names)) == [], r["alert"]
        assert r["for"] and r["labels"]["severity"] in ("warning", "critical")
        assert r["annotations"]["summary"]
    assert "0.8 *" in rules["StokerHitRateDropped"]["expr"]  # down more than 20%
    assert "offset 15m" in rules["StokerHitRateDropped"]["expr"]
    assert "> 5" in rules["StokerInvalidationLagHigh"]["expr"]
    assert "histogram_quantile(0.99" in rules["StokerInvalidationLagHigh"]["expr"]


def test_alerts__a_missing_metric_is_caught():
    """The check itself can fail: a name the registry does not know is reported."""
    assert "stoker_made_up_total" not in exposed()
