"""Issue 16, containers: docker/ can't be run here (no Docker engine), so this checks what
can be checked without one: the compose file parses, its workers mount a config that
`amps-kafka config check` accepts, and Prometheus scrapes each worker's admin port."""

from __future__ import annotations

from pathlib import Path

import yaml
from click.testing import CliRunner

from amps_on_kafka.cli import main
from amps_on_kafka.config import load_config

DOCKER = Path(__file__).parents[2] / "docker"
CONFIG_IN_CONTAINER = "/etc/amps-kafka/worker.yaml"


def _compose() -> dict:
    return yaml.safe_load((DOCKER / "compose.yml").read_text())


def _mounted_config(service: dict) -> Path:
    (mount,) = [v for v in service["volumes"] if v.split(":")[1] == CONFIG_IN_CONTAINER]
    return DOCKER / mount.split(":")[0]


def test_compose_runs_a_broker_two_workers_and_prometheus():
    services = _compose()["services"]
    assert {"kafka", "topics", "worker-1", "worker-2", "prometheus"} <= set(services)
    assert services["kafka"]["image"].startswith("apache/kafka:")
    for name in ("worker-1", "worker-2"):
        worker = services[name]
        assert worker["build"]["dockerfile"] == "docker/Dockerfile"
        assert worker["depends_on"]["topics"]["condition"] == "service_completed_successfully"
        assert "9007" in {port.split(":")[1] for port in worker["ports"]}


def test_the_workers_configs_pass_config_check_and_prometheus_scrapes_their_admin_port():
    services = _compose()["services"]
    workers = [s for name, s in services.items() if name.startswith("worker-")]
    configs = {_mounted_config(worker) for worker in workers}
    assert configs == {_mounted_config(services["topics"])}  # topics made from the same file
    for path in configs:
        result = CliRunner().invoke(main, ["config", "check", str(path)])
        assert result.exit_code == 0, result.output
        config = load_config(path)
        assert config.kafka.bootstrap_servers == "kafka:19092"  # the INTERNAL listener
        assert (
            "INTERNAL://kafka:19092"
            in services["kafka"]["environment"]["KAFKA_ADVERTISED_LISTENERS"]
        )
        admin_port = config.admin.listen.rpartition(":")[2]
    prometheus = yaml.safe_load((DOCKER / "prometheus.yml").read_text())
    (job,) = prometheus["scrape_configs"]
    (static,) = job["static_configs"]
    names = sorted(name for name in services if name.startswith("worker-"))
    assert static["targets"] == [f"{name}:{admin_port}" for name in names]


def test_the_image_runs_the_worker_on_python_312_slim():
    lines = (DOCKER / "Dockerfile").read_text().splitlines()
    assert "FROM python:3.12-slim" in lines
    assert 'ENTRYPOINT ["amps-kafka", "worker"]' in lines
    assert any(CONFIG_IN_CONTAINER in line for line in lines if line.startswith("CMD"))
