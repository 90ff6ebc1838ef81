"""deploy/k8s and deploy/ci validated offline: Kubernetes schemas, KEDA and workflow structure."""

from __future__ import annotations

import copy
import subprocess
import sys
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from stoker.registry import WORKER_NAMES
from streams.topics import TOPICS
from streams.worker import default_group_id
from tests.deploy.conftest import DEPLOY, settings_from, unknown_settings

K8S = DEPLOY / "k8s"
WORKFLOW = DEPLOY / "ci" / "github-actions-model-deploy.yml"
CORE_KINDS = {"Deployment", "ConfigMap", "PodDisruptionBudget", "Service"}


def docs() -> list[tuple[Path, dict[str, Any]]]:
    return [
        (p, d)
        for p in sorted(K8S.glob("*.yaml"))
        if p.name != "kustomization.yaml"
        for d in yaml.safe_load_all(p.read_text())
        if d
    ]


def of_kind(kind: str) -> list[dict[str, Any]]:
    return [d for _, d in docs() if d["kind"] == kind]


def named(kind: str, name: str) -> dict[str, Any]:
    [doc] = [d for d in of_kind(kind) if d["metadata"]["name"] == name]
    return doc


@pytest.mark.parametrize(
    "doc",
    [
        pytest.param(d, id=f"{p.name}:{d['metadata']['name']}")
        for p, d in docs()
        if d["kind"] in CORE_KINDS  # the KEDA ScaledObject is a CRD: checked structurally below
    ],
)
def test_k8s__core_kinds_pass_the_kubernetes_schema(doc: dict[str, Any]):
    kubernetes_validate.validate(doc, kubernetes_validate.latest_version(), strict=True)


def test_k8s__schema_check_catches_a_misspelt_field():
    bad = copy.deepcopy(of_kind("Deployment")[0])
    bad["spec"]["replicaz"] = 3
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, kubernetes_validate.latest_version(), strict=True)


def test_k8s__a_deployment_per_worker_reading_config_and_secret():
    deployments = {d["metadata"]["name"]: d for d in of_kind("Deployment")}
    assert set(deployments) == {f"stoker-{n}" for n in (*WORKER_NAMES, "gateway")}
    [config] = of_kind("ConfigMap")
    assert unknown_settings(config["data"]) == []
    port = settings_from(config["data"]).metrics_port
    assert port > 0
    for name in WORKER_NAMES:
        spec = deployments[f"stoker-{name}"]["spec"]
        assert (
            spec["selector"]["matchLabels"].items()
            <= spec["template"]["metadata"]["labels"].items()
        )
        [c] = spec["template"]["spec"]["containers"]
        assert c["args"] == ["worker", name]
        assert {"configMapRef": {"name": config["metadata"]["name"]}} in c["envFrom"]
        env_names = {e["name"]: e for e in c["env"]}
        assert unknown_settings(env_names) == []
        secret = env_names["STOKER_REDIS_URL"]["valueFrom"]["secretKeyRef"]
        assert secret["name"] == "stoker-secrets"  # referenced, never inlined
        assert {"name": "metrics", "containerPort": port} in c["ports"]


def test_k8s__gateway_serves_two_replicas_with_probes_and_a_drain_inside_the_grace():
    [config] = of_kind("ConfigMap")
    s = settings_from(config["data"])
    assert s.gateway_host == "0.0.0.0" and s.gateway_upstream_url
    assert s.kafka_bootstrap and s.semantic_backend == "server" and s.qdrant_url
    spec = named("Deployment", "stoker-gateway")["spec"]
    assert spec["replicas"] == 2
    assert spec["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
    pod = spec["template"]["spec"]
    # SIGKILL must not land inside the notice, the drain and the log flush after them
    assert s.gateway_drain_notice_s > 0  # the Service stops routing before the listener closes
    assert pod["terminationGracePeriodSeconds"] > s.gateway_drain_notice_s + s.gateway_drain_s
    [c] = pod["containers"]
    assert c["args"] == ["gateway"]
    assert {"configMapRef": {"name": config["metadata"]["name"]}} in c["envFrom"]
    env = {e["name"]: e for e in c["env"]}
    assert unknown_settings(env) == []
    for e in env.values():  # secrets referenced, never inlined
        assert e["valueFrom"]["secretKeyRef"]["name"] == "stoker-secrets", e["name"]
    assert not env["STOKER_REDIS_URL"]["valueFrom"]["secretKeyRef"].get("optional")
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert ports == {"http": s.gateway_port, "metrics": s.metrics_port}
    assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
    assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}


def test_k8s__disruption_budgets_and_metrics_service_select_the_pods():
    pods = [d["spec"]["template"]["metadata"]["labels"] for d in of_kind("Deployment")]
    pdbs = of_kind("PodDisruptionBudget")
    assert len(pdbs) == len(pods)
    for pdb in pdbs:
        sel = pdb["spec"]["selector"]["matchLabels"]
        assert sum(sel.items() <= labels.items() for labels in pods) == 1
    assert {d["metadata"]["name"] for d in of_kind("Service")} == {
        "stoker-metrics",
        "stoker-gateway",
    }
    # one scrape path for every pod, the gateway's included: its port named metrics
    svc = named("Service", "stoker-metrics")
    assert svc["spec"]["clusterIP"] == "None"
    assert all(svc["spec"]["selector"].items() <= labels.items() for labels in pods)
    assert svc["spec"]["ports"][0]["targetPort"] == "metrics"
    port = svc["metadata"]["annotations"]["prometheus.io/port"]
    for d in of_kind("Deployment"):
        [c] = d["spec"]["template"]["spec"]["containers"]
        assert {"name": "metrics", "containerPort": int(port)} in c["ports"], d["metadata"]["name"]


def test_k8s__gateway_service_port_80_to_the_gateway_pods_only():
    svc = named("Service", "stoker-gateway")
    assert "prometheus.io/scrape" not in svc["metadata"].get("annotations", {})  # no double scrape
    pods = {
        d["metadata"]["name"]: d["spec"]["template"]["metadata"]["labels"]
        for d in of_kind("Deployment")
    }
    sel = svc["spec"]["selector"].items()
    assert [n for n, labels in pods.items() if sel <= labels.items()] == ["stoker-gateway"]
    assert svc["spec"]["ports"] == [{"name": "http", "port": 80, "targetPort": "http"}]


def test_k8s__keda_scales_the_traffic_worker_on_its_consumer_lag():
    [so] = of_kind("ScaledObject")
    assert so["apiVersion"] == "keda.sh/v1alpha1"
    spec = so["spec"]
    assert spec["scaleTargetRef"]["name"] == "stoker-traffic"
    assert 1 <= spec["minReplicaCount"] <= spec["maxReplicaCount"] <= TOPICS["inference.requests"]
    [trigger] = spec["triggers"]
    meta = trigger["metadata"]
    assert trigger["type"] == "kafka"
    assert meta["consumerGroup"] == default_group_id("traffic")
    assert meta["topic"] == "inference.requests"
    assert meta["lagThreshold"].isdigit()  # KEDA wants strings in metadata
    [config] = of_kind("ConfigMap")
    assert meta["bootstrapServers"] == config["data"]["STOKER_KAFKA_BOOTSTRAP"]
    traffic = next(d for d in of_kind("Deployment") if d["metadata"]["name"] == "stoker-traffic")
    assert "replicas" not in traffic["spec"]  # KEDA owns the count


def test_k8s__kustomization_lists_every_manifest():
    kust = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    files = {p.name for p in K8S.glob("*.yaml")} - {"kustomization.yaml"}
    assert set(kust["resources"]) == files


def test_ci__workflow_passes_the_github_schema_and_waits_for_ready():
    out = subprocess.run(
        [sys.executable, "-m", "check_jsonschema", "--builtin-schema", "vendor.github-workflows",
         str(WORKFLOW)],
        capture_output=True,
        text=True,
        timeout=120,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
    wf = yaml.safe_load(WORKFLOW.read_text())
    steps = wf["jobs"]["deploy"]["steps"]
    runs = " ".join(s.get("run", "") for s in steps)
    assert "stoker deploy" in runs and "--wait" in runs and "--until ready" in runs
    assert unknown_settings(wf["jobs"]["deploy"]["env"]) == []
