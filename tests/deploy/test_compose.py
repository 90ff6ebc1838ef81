"""docker-compose.yml, parsed (no Docker engine here): services, env, health, ports, scraping."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import tomllib
from typing import Any

import pytest

from stoker.registry import WORKER_NAMES
from tests.deploy.conftest import DEPLOY, ROOT, load_yaml, settings_from, unknown_settings

COMPOSE = ROOT / "docker-compose.yml"
SERVICES = {
    "kafka", "redis", "qdrant", "sim-backend", "gateway", "prometheus", "grafana", *WORKER_NAMES
}  # fmt: skip


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
    for name in (*WORKER_NAMES, "sim-backend", "gateway"):
        assert services[name]["build"] == ".", name
    for name in WORKER_NAMES:
        assert services[name]["command"] == ["worker", name]
    assert services["sim-backend"]["command"][0] == "sim-backend"
    assert services["gateway"]["command"] == ["gateway"]


def test_compose__every_stoker_env_is_a_setting_with_a_valid_value(compose: dict[str, Any]):
    for name, svc in compose["services"].items():
        env = svc.get("environment") or {}
        assert unknown_settings(env) == [], name
        s = settings_from(env)  # raises on a bad value (Literal choice, port range, ...)
        if name in WORKER_NAMES:
            assert s.metrics_port > 0 and s.kafka_bootstrap and s.redis_url, name


def test_compose__gateway_on_production_services_in_front_of_sim_backend(
    compose: dict[str, Any],
):
    services = compose["services"]
    gw = services["gateway"]
    s = settings_from(gw["environment"])
    # production shape: the request log goes to Kafka, the cache to Redis and the Qdrant server
    assert s.kafka_bootstrap and s.redis_url and s.qdrant_url
    assert s.semantic_backend == "server"
    assert s.gateway_host == "0.0.0.0"  # reachable from the host and from Prometheus
    sim = services["sim-backend"]["command"]
    sim_port = sim[sim.index("--port") + 1]
    assert s.gateway_upstream_url == f"http://sim-backend:{sim_port}"
    assert f"{s.gateway_port}:{s.gateway_port}" in gw["ports"]
    # its healthcheck is readiness (503 while draining), on the port it serves
    assert f":{s.gateway_port}/readyz" in " ".join(gw["healthcheck"]["test"])
    assert {"kafka", "redis", "qdrant", "sim-backend"} <= set(gw["depends_on"])
    # compose's default stop grace (10 s) would cut the SIGTERM drain short
    grace = gw["stop_grace_period"]
    assert grace.endswith("s") and int(grace[:-1]) > s.gateway_drain_s


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


def test_compose__prometheus_scrapes_the_gateway_on_its_own_port(compose: dict[str, Any]):
    services = compose["services"]
    prom = load_yaml(DEPLOY / "prometheus" / "prometheus.yml")
    [job] = [j for j in prom["scrape_configs"] if j["job_name"] == "stoker-gateway"]
    s = settings_from(services["gateway"]["environment"])
    assert job.get("metrics_path", "/metrics") == "/metrics"
    assert [t for sc in job["static_configs"] for t in sc["targets"]] == [
        f"gateway:{s.gateway_port}"
    ]
    # no second /metrics (STOKER_METRICS_PORT) beside the scraped one: the same series twice
    assert s.metrics_port == 0
    assert "gateway" in services["prometheus"]["depends_on"]


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


def test_packaging__the_wheel_takes_every_subpackage():
    """A bare list of top-level names built a wheel without caches.matching, stoker.commands
    and the rest: an installed stoker that could run no verb. setuptools is asked in a process of
    its own: once another test in this worker has imported the stdlib distutils, importing
    setuptools here fails on its distutils shim, whatever the packages say."""
    find = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
    script = (
        "import json, sys\n"
        "from setuptools import find_packages\n"
        "print(json.dumps(find_packages(sys.argv[1], include=json.loads(sys.argv[2]))))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", script, str(ROOT), json.dumps(find["find"]["include"])],
        capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    found = set(json.loads(out.stdout))
    top = {p.removesuffix("*") for p in find["find"]["include"]}
    on_disk = {
        ".".join(init.parent.relative_to(ROOT).parts)
        for pkg in top
        for init in (ROOT / pkg).rglob("__init__.py")
    }
    assert on_disk - found == set() and {"caches.matching", "stoker.commands"} <= found
    assert not any(p == "tests" or p.startswith("tests.") for p in found)


def test_dockerfile__copies_every_package_and_exposes_the_gateway_port():
    """`pip install .` in the image needs every package pyproject.toml installs copied in."""
    text = (ROOT / "Dockerfile").read_text()
    find = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
    packages = [p.removesuffix("*") for p in find["find"]["include"]]
    for pkg in packages:
        assert re.search(rf"^COPY {pkg} {pkg}$", text, re.M), pkg
    [expose] = re.findall(r"^EXPOSE (.+)$", text, re.M)
    port = settings_from(load_yaml(COMPOSE)["services"]["gateway"]["environment"]).gateway_port
    assert str(port) in expose.split()


def test_compose__passes_the_compose_spec_schema():
    """The compose-spec schema check-jsonschema ships: misspelt keys and wrong types, offline."""
    out = subprocess.run(
        [sys.executable, "-m", "check_jsonschema", "--builtin-schema", "vendor.compose-spec",
         str(COMPOSE)],
        capture_output=True,
        text=True,
        timeout=120,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr


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
