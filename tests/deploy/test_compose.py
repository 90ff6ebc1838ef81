"""docker-compose.yml, parsed (no Docker engine here): services, env, health, ports, scraping."""

from __future__ import annotations

import re
import shutil
import subprocess
from typing import Any

import pytest

from stoker.registry import WORKER_NAMES
from tests.deploy.conftest import DEPLOY, ROOT, load_yaml, settings_from, unknown_settings

COMPOSE = ROOT / "docker-compose.yml"
SERVICES = {"kafka", "redis", "qdrant", "sim-backend", "prometheus", "grafana", *WORKER_NAMES}


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    doc: dict[str, Any] = load_yaml(COMPOSE)
    return doc


def test_compose__services_images_and_kraft_kafka(compose: dict[str, Any]):
    services = compose["services"]
    assert set(services) == SERVICES
    kafka = services["kafka"]
    assert kafka["image"].startswith("apache/kafka:")
    assert "controller" in kafka["environment"]["KAFKA_PROCESS_ROLES"]  # KRaft, no ZooKeeper
    assert kafka["environment"]["KAFKA_AUTO_CREATE_TOPICS_ENABLE"] == "false"
    for name in (*WORKER_NAMES, "sim-backend"):
        assert services[name]["build"] == ".", name
    for name in WORKER_NAMES:
        assert services[name]["command"] == ["worker", name]
    assert services["sim-backend"]["command"][0] == "sim-backend"


def test_compose__every_stoker_env_is_a_setting_with_a_valid_value(compose: dict[str, Any]):
    for name, svc in compose["services"].items():
        env = svc.get("environment") or {}
        assert unknown_settings(env) == [], name
        s = settings_from(env)  # raises on a bad value (Literal choice, port range, ...)
        if name in WORKER_NAMES:
            assert s.metrics_port > 0 and s.kafka_bootstrap and s.redis_url, name


def test_compose__healthchecks_and_depends_on(compose: dict[str, Any]):
    services = compose["services"]
    for name, svc in services.items():
        assert svc.get("healthcheck", {}).get("test"), f"{name} has no healthcheck"
        deps = svc.get("depends_on") or {}
        for dep, cond in deps.items():
            assert dep in services, f"{name} depends on unknown {dep}"
            if cond["condition"] == "service_healthy":
                assert services[dep].get("healthcheck"), f"{name} waits on {dep}'s health"
    for name in WORKER_NAMES:
        assert {"kafka", "redis", "qdrant"} <= set(services[name]["depends_on"]), name


def test_compose__host_ports_unique(compose: dict[str, Any]):
    host_ports = [
        p.split(":")[0] for svc in compose["services"].values() for p in svc.get("ports", [])
    ]
    assert len(host_ports) == len(set(host_ports))


def test_compose__prometheus_scrapes_every_worker_on_its_metrics_port(compose: dict[str, Any]):
    services = compose["services"]
    prom = load_yaml(DEPLOY / "prometheus" / "prometheus.yml")
    targets = {
        t
        for job in prom["scrape_configs"]
        if job["job_name"] == "stoker"
        for sc in job["static_configs"]
        for t in sc["targets"]
    }
    ports = {n: services[n]["environment"]["STOKER_METRICS_PORT"] for n in WORKER_NAMES}
    assert targets == {f"{n}:{p}" for n, p in ports.items()}
    # the worker healthcheck probes the same port
    for n in WORKER_NAMES:
        assert f":{ports[n]}/metrics" in " ".join(services[n]["healthcheck"]["test"])
    mounts = services["prometheus"]["volumes"]
    assert "./deploy/prometheus:/etc/prometheus:ro" in mounts
    for rule_file in prom["rule_files"]:
        assert (DEPLOY / "prometheus" / rule_file.removeprefix("/etc/prometheus/")).is_file()


def test_compose__grafana_provisions_the_dashboard(compose: dict[str, Any]):
    grafana = compose["services"]["grafana"]
    mounts = dict(v.rsplit(":", 2)[:2] for v in grafana["volumes"])  # type: ignore[misc]
    dash_dir = mounts["./deploy/grafana/dashboards"]
    provider = load_yaml(DEPLOY / "grafana" / "provisioning" / "dashboards" / "stoker.yml")
    assert provider["providers"][0]["options"]["path"] == dash_dir
    assert (DEPLOY / "grafana" / "dashboards" / "stoker.json").is_file()
    ds = load_yaml(DEPLOY / "grafana" / "provisioning" / "datasources" / "prometheus.yml")
    assert ds["datasources"][0]["url"] == "http://prometheus:9090"


def test_dockerfile__slim_python_the_lock_with_hashes_then_the_package():
    text = (ROOT / "Dockerfile").read_text()
    assert re.search(r"^FROM python:3\.11-slim$", text, re.M)
    lock = text.index("--require-hashes --no-deps")
    assert "-r requirements.lock" in text and "download.pytorch.org/whl/cpu" in text
    assert lock < text.index("pip install --no-deps --no-build-isolation .")
    assert 'ENTRYPOINT ["stoker"]' in text


def test_compose__docker_compose_config_where_available():
    """Needs the compose plugin (not on our machines: no Docker at all); runs where it exists."""
    docker = shutil.which("docker")
    if docker is None:
        pytest.skip(
            "no docker CLI here; the parse tests above stand in for `docker compose config`"
        )
    plugin = subprocess.run([docker, "compose", "version"], capture_output=True, timeout=30)
    if plugin.returncode != 0:
        pytest.skip("docker CLI without the compose plugin; the parse tests above stand in")
    out = subprocess.run(
        [docker, "compose", "-f", str(COMPOSE), "config", "--quiet"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
