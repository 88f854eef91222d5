"""Apache Kafka's jars, fetched from Maven Central once and kept in a cache directory.

Maven resolves the broker's runtime classpath from the packaged ``assets/pom.xml``, so the
project needs no hand-kept list of jars and no download of a Kafka tarball. A marker file,
written only after a complete fetch and holding the pom's hash, tells a finished cache from
an interrupted (or outdated) one, which is fetched again.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
from collections.abc import Callable
from importlib import resources
from pathlib import Path

from amps_on_kafka.broker.errors import BrokerError

KAFKA_VERSION = "4.3.1"
CACHE_ENV = "AMPS_KAFKA_CACHE"
_MARKER = "complete"


def asset_text(name: str) -> str:
    """The text of a file packaged under ``amps_on_kafka/broker/assets``."""
    return (resources.files("amps_on_kafka.broker") / "assets" / name).read_text("utf-8")


def cache_dir() -> Path:
    """Where the jars live: ``$AMPS_KAFKA_CACHE``, else ``~/.cache/amps_on_kafka/kafka-<v>``."""
    explicit = os.environ.get(CACHE_ENV)
    if explicit:
        return Path(explicit).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "amps_on_kafka" / f"kafka-{KAFKA_VERSION}"


def require_tool(name: str, hint: str) -> str:
    """The full path of an executable on PATH, or a BrokerError that says how to get it."""
    path = shutil.which(name)
    if path is None:
        raise BrokerError(f"{name} not found on PATH: {hint}")
    return path


def fetch_jars(cache: Path | None = None, *, echo: Callable[[str], None] | None = None) -> Path:
    """Return the directory holding Kafka's jars, running Maven first if they aren't there.

    Safe to call from several processes at once: a file lock makes the second one wait for
    the first fetch and then reuse it.
    """
    cache = cache or cache_dir()
    cache.mkdir(parents=True, exist_ok=True)
    pom = asset_text("pom.xml")
    stamp = hashlib.sha256(pom.encode()).hexdigest()
    libs = cache / "libs"
    with open(cache / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        marker = cache / _MARKER
        if marker.is_file() and marker.read_text().strip() == stamp:
            return libs
        if echo:
            echo(f"fetching Apache Kafka {KAFKA_VERSION} jars with Maven into {cache} ...")
        _run_maven(cache, pom, libs)
        marker.write_text(stamp + "\n")
    return libs


def _run_maven(cache: Path, pom: str, libs: Path) -> None:
    """Copy the pom's runtime dependencies into a clean ``libs`` directory."""
    mvn = require_tool("mvn", "install Apache Maven 3.6+ (e.g. `apt-get install maven`)")
    (cache / _MARKER).unlink(missing_ok=True)
    shutil.rmtree(libs, ignore_errors=True)
    pom_path = cache / "pom.xml"
    pom_path.write_text(pom, "utf-8")
    cmd = [
        mvn,
        "-q",
        "-B",
        "-f",
        str(pom_path),
        "dependency:copy-dependencies",
        f"-DoutputDirectory={libs}",
        "-DincludeScope=runtime",
    ]
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if done.returncode != 0 or not any(libs.glob("*.jar")):
        output = (done.stdout + done.stderr).strip()[-3000:]
        raise BrokerError(
            f"Maven could not fetch the Kafka jars (exit {done.returncode}):\n{output}"
        )


def classpath(libs: Path) -> str:
    """The Java classpath made of every jar in ``libs``, in a stable order."""
    return os.pathsep.join(str(jar) for jar in sorted(libs.glob("*.jar")))
