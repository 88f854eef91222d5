"""The wheel as a user installs it: built from the checkout, used from outside it.

Issue 17 asks that the wheel work installed into a clean environment, with its package
metadata (license, classifiers) set. The wheel is built without the checkout on the path
and unpacked into a directory of its own, which comes first on the path of a Python run
from elsewhere: every file the package needs at run time (the admin page, the broker's
assets, `py.typed`) must be in it.
"""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    command = [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(out), str(ROOT)]
    subprocess.run(command, check=True, capture_output=True, timeout=300)
    (built,) = out.glob("amps_on_kafka-*.whl")
    return built


def test_the_wheel_carries_its_license_and_classifiers(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as archive:
        metadata = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        text = archive.read(metadata).decode()
        names = archive.namelist()
    assert "License-Expression: Apache-2.0" in text
    assert "Classifier: Typing :: Typed" in text
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names)
    shipped = (
        "amps_on_kafka/py.typed",
        "amps_on_kafka/admin/status.html",
        "amps_on_kafka/spark/log4j2.properties",  # the local Spark JVM's log config
        "amps_on_kafka/examples/example.yaml",  # amps-kafka config example: the tour's
        "amps_on_kafka/examples/schemas/trade.avsc",
    )
    for data in shipped:
        assert data in names, f"{data} missing from the wheel"


def test_the_installed_wheel_runs_outside_the_checkout(wheel: Path, tmp_path: Path) -> None:
    site = tmp_path / "site"
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(site)
    probe = (
        "import amps_on_kafka, importlib.resources as r;"
        "print(amps_on_kafka.__file__);"
        "print(r.files('amps_on_kafka.admin').joinpath('status.html').is_file())"
    )
    run = subprocess.run(
        [sys.executable, "-c", probe],
        cwd=tmp_path,
        env={"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    where, page = run.stdout.split()
    assert where.startswith(str(site)) and page == "True"
    cli = subprocess.run(
        [sys.executable, "-m", "amps_on_kafka.cli", "--help"],
        cwd=tmp_path,
        env={"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert cli.returncode == 0, cli.stderr
    assert "worker" in cli.stdout


def test_the_wheel_writes_the_example_config_the_tour_uses(wheel: Path, tmp_path: Path) -> None:
    """The README's tour names config/example.yaml, which only a clone had."""
    site = tmp_path / "site"
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(site)

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "amps_on_kafka.cli", *args],
            cwd=tmp_path,
            env={"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin"},
            capture_output=True,
            text=True,
            timeout=60,
        )

    written = cli("config", "example")
    assert written.returncode == 0, written.stderr
    assert written.stdout.split() == ["config/example.yaml", "config/schemas/trade.avsc"]
    checked = cli("config", "check", "config/example.yaml")  # its Avro schema found and read
    assert checked.returncode == 0 and "valid (2 topics, 2 SOW" in checked.stdout, checked.stderr
    again = cli("config", "example")
    assert again.returncode == 1 and "nothing written: already there" in again.stderr
