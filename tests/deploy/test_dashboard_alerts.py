"""The Grafana dashboard and the alert rules reference only metrics stoker registers."""

from __future__ import annotations

import json
import re
from typing import Any

from prometheus_client import REGISTRY

from gateway import metrics as gateway_metrics
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
    """Series name -> family name, for every stoker family in the default registry.

    The gateway's families register when gateway.metrics is imported (above): `stoker gateway`
    serves them, register_all() (the workers' set) does not import them.
    """
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


def families_of(module: Any) -> set[str]:
    """The family names a metrics module defines (a Counter's name without _total)."""
    return {
        f.name
        for v in vars(module).values()
        if hasattr(v, "collect") and hasattr(v, "_name")
        for f in v.collect()
    }


def row_panels(title: str) -> list[dict[str, Any]]:
    """The panels under the row `title`, up to the next row (the dashboard's flat layout)."""
    panels = json.loads(DASHBOARD.read_text())["panels"]
    start = next(i for i, p in enumerate(panels) if p["type"] == "row" and p["title"] == title)
    out = []
    for p in panels[start + 1 :]:
        if p["type"] == "row":
            break
        out.append(p)
    return out


def balanced(expr: str) -> bool:
    """Brackets nest and quotes close: the slips a hand edit makes (promtool checks the rest)."""
    pairs, stack, quote = {")": "(", "]": "[", "}": "{"}, [], None
    for ch in expr:
        if quote:
            quote = None if ch == quote else quote
        elif ch in "\"'":
            quote = ch
        elif ch in "([{":
            stack.append(ch)
        elif ch in pairs and (not stack or stack.pop() != pairs[ch]):
            return False
    return not stack and quote is None


def test_dashboard__every_referenced_metric_exists():
    names = exposed()
    used = {m for e in dashboard_exprs() for m in NAME.findall(e)}
    assert used and sorted(used - set(names)) == []


def test_dashboard__shows_every_stoker_family():
    names = exposed()
    shown = {names[m] for e in dashboard_exprs() for m in NAME.findall(e) if m in names}
    assert sorted(set(names.values()) - shown) == []


def test_dashboard__gateway_row_shows_every_gateway_family_and_flags_failing_open():
    panels = row_panels("Gateway")
    names = exposed()
    shown = {
        names[m]
        for p in panels
        for t in p["targets"]
        for m in NAME.findall(t["expr"])
        if m in names
    }
    assert families_of(gateway_metrics) and families_of(gateway_metrics) <= shown
    # the failed-open bypasses are their own series, painted red
    [bypass] = [
        p for p in panels if any("stoker_gateway_bypass" in t["expr"] for t in p["targets"])
    ]
    failed = [t for t in bypass["targets"] if 'reason=~"' in t["expr"]]
    [target] = failed
    reasons = re.search(r'reason=~"([^"]+)"', target["expr"])
    assert reasons and set(reasons.group(1).split("|")) == gateway_metrics.FAILED_OPEN
    [override] = bypass["fieldConfig"]["overrides"]
    assert re.match(
        override["matcher"]["options"], target["legendFormat"].replace("{{reason}}", "x")
    )
    assert override["properties"][0]["value"]["fixedColor"] == "red"


def test_dashboard__panels_fit_the_grid_without_overlapping():
    cells: dict[tuple[int, int], str] = {}
    for p in json.loads(DASHBOARD.read_text())["panels"]:
        g = p["gridPos"]
        assert g["x"] + g["w"] <= 24, p["title"]
        for x in range(g["x"], g["x"] + g["w"]):
            for y in range(g["y"], g["y"] + g["h"]):
                assert (x, y) not in cells, f"{p['title']} overlaps {cells[(x, y)]}"
                cells[(x, y)] = p["title"]


def test_dashboard_and_alerts__expressions_are_balanced():
    exprs = dashboard_exprs() + [r["expr"] for r in alert_rules()]
    assert [e for e in exprs if not balanced(e)] == []
    assert not balanced('sum(rate(x{a="b"}[5m])')  # the check itself can fail


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
        unknown = set(NAME.findall(r["expr"])) - set(names)
        assert sorted(unknown) == [], r["alert"]
        assert r["for"] and r["labels"]["severity"] in ("warning", "critical")
        assert r["annotations"]["summary"]
    # what StokerHitRateDropped, StokerSchedulerLeaderMissing and StokerServedWrongAboveBudget
    # do is tested by running them: deploy/prometheus/alerts_test.yml (test_alert_rules.py)
    assert "> 5" in rules["StokerInvalidationLagHigh"]["expr"]
    assert "histogram_quantile(0.99" in rules["StokerInvalidationLagHigh"]["expr"]


def test_alerts__gateway_failing_open_and_request_log_drops():
    rules = {r["alert"]: r for r in alert_rules()}
    fail_open = rules["StokerGatewayFailingOpen"]
    expr = " ".join(fail_open["expr"].split())
    reasons = re.search(r'stoker_gateway_bypass_total\{reason=~"([^"]+)"\}\[5m\]', expr)
    assert reasons and set(reasons.group(1).split("|")) == gateway_metrics.FAILED_OPEN
    assert "> 0.1 * sum(rate(stoker_gateway_served_total[5m]))" in expr  # 10% of served
    assert fail_open["for"] == "10m"
    drops = rules["StokerGatewayRequestLogDropping"]
    assert " ".join(drops["expr"].split()) == (
        'rate(stoker_gateway_log_events_total{result="dropped"}[5m]) > 0'
    )
    assert drops["for"] == "10m"


def test_alerts__a_missing_metric_is_caught():
    """The check itself can fail: a name the registry does not know is reported."""
    assert "stoker_made_up_total" not in exposed()
