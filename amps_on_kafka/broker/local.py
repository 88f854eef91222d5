"""A single-node KRaft Kafka broker that the project runs itself, from Kafka's own jars.

Everything lives in one data directory: ``server.properties``, ``log4j2.yaml``, the Kafka
log directory ``kafka/``, the state file ``broker.json`` (pid and address of the running
broker), ``broker.log`` (Kafka's log) and ``broker.out`` (the JVM's stdout and stderr); both
logs hold the current run only, so they stay small without rolling.
The state file is what makes ``start()`` idempotent across processes: a second
``amps-kafka broker start`` finds the running broker there and returns its address.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import subprocess
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from amps_on_kafka.broker import config, jars, process
from amps_on_kafka.broker.errors import BrokerError
from amps_on_kafka.broker.secure import SecureFiles
from amps_on_kafka.log.kafka import Bootstrap, await_answer

HOME_ENV = "AMPS_KAFKA_HOME"
DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 39092
DEFAULT_SECURE_PORT = 39094  # beside the plain broker's 39092 and its controller's 39093
START_TIMEOUT = 60.0
STOP_TIMEOUT = 30.0
# Small heap and the serial collector: one broker for development and tests on a 2-core
# machine, not a production server.
JVM_OPTIONS = (
    "-Xms128m",
    "-Xmx768m",
    "-XX:+UseSerialGC",
    "-XX:+ExitOnOutOfMemoryError",
    "-Djava.awt.headless=true",
)


def default_data_dir(*, secure: bool = False) -> Path:
    """``$AMPS_KAFKA_HOME``, else ``~/.local/share/amps_on_kafka/broker``; a secured
    broker's is the same with ``-secure`` appended, so both can run side by side."""
    explicit = os.environ.get(HOME_ENV)
    if explicit:
        path = Path(explicit).expanduser()
    else:
        base = os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share"
        path = Path(base) / "amps_on_kafka" / "broker"
    return path.with_name(path.name + "-secure") if secure else path


@dataclass(frozen=True)
class BrokerStatus:
    """What ``LocalBroker.status()`` found; ``bootstrap`` is where the broker is (or would be)."""

    running: bool
    pid: int | None
    bootstrap: str
    data_dir: Path


class LocalBroker:
    """Start, stop and inspect the local broker that keeps its files in ``data_dir``."""

    def __init__(
        self,
        data_dir: Path | str | None = None,
        *,
        host: str = DEFAULT_HOST,
        port: int = DEFAULT_PORT,
        controller_port: int | None = None,
        echo: Callable[[str], None] | None = None,
        secure: bool = False,
    ) -> None:
        """`secure`: the client listener is SASL_SSL (broker/secure.py), not PLAINTEXT."""
        # Absolute, because the running JVM is recognised by this path in its command line.
        self.data_dir = Path(data_dir or default_data_dir(secure=secure)).expanduser().resolve()
        self.host = host
        self.port = port
        self.controller_port = controller_port or port + 1
        self._echo = echo or (lambda _message: None)
        self.secure = SecureFiles(self.data_dir) if secure else None

    @property
    def _properties(self) -> Path:
        return self.data_dir / "server.properties"

    @property
    def _state_file(self) -> Path:
        return self.data_dir / "broker.json"

    def status(self) -> BrokerStatus:
        """Whether the broker recorded in the data directory is running, its pid and address."""
        state = self._read_state()
        pid = state.get("pid")
        running = pid is not None and process.is_alive(pid, str(self._properties))
        bootstrap = state.get("bootstrap") or f"{self.host}:{self.port}"
        return BrokerStatus(running, pid if running else None, bootstrap, self.data_dir)

    def start(self, timeout: float = START_TIMEOUT) -> Bootstrap:
        """Make sure the broker runs and answers; return its bootstrap address (carrying
        the client properties that reach it when secured: log.kafka.Bootstrap).

        A broker already running from this data directory is reused whatever port was asked
        for. Otherwise the jars are fetched (first time only), the storage is formatted
        (first time only) and a JVM is launched; this returns once the broker answers a
        metadata request, or raises BrokerError with the tail of its log.
        """
        with self._lock():
            current = self.status()
            if current.running:
                bootstrap = self._client_bootstrap(current.bootstrap)
                self._await(current.pid, bootstrap, timeout)
                return bootstrap
            return self._launch(timeout)

    def stop(self, timeout: float = STOP_TIMEOUT) -> bool:
        """Stop the broker (SIGTERM, then SIGKILL after ``timeout`` s); False if none ran."""
        with self._lock():
            current = self.status()
            if current.running and not process.terminate(
                current.pid, str(self._properties), timeout
            ):
                raise BrokerError(f"broker pid {current.pid} survived SIGKILL")
            self._state_file.unlink(missing_ok=True)
            return current.running

    def _launch(self, timeout: float) -> str:
        libs = jars.fetch_jars(echo=self._echo)
        classpath = jars.classpath(libs)
        java = jars.require_tool("java", "install Java 17+ (e.g. `apt-get install openjdk-17-jre`)")
        self._check_ports_free()
        formatted = (self.data_dir / "kafka" / "meta.properties").exists()
        self._check_same_security(formatted)
        self._write_config()
        if not formatted:
            self._format(java, classpath)
        bootstrap = self._client_bootstrap(f"{self.host}:{self.port}")
        self._echo(f"starting Kafka broker at {bootstrap} (data in {self.data_dir}) ...")
        pid = process.launch(
            [
                java,
                *JVM_OPTIONS,
                f"-Dkafka.logs.dir={self.data_dir}",
                f"-Dlog4j2.configurationFile={self.data_dir / 'log4j2.yaml'}",
                "-cp",
                classpath,
                "kafka.Kafka",
                str(self._properties),
            ],
            cwd=self.data_dir,
            output=self.data_dir / "broker.out",
        )
        self._write_state({"pid": pid, "bootstrap": str(bootstrap)})
        try:
            self._await(pid, bootstrap, timeout)
        except BrokerError:
            process.terminate(pid, str(self._properties), 5.0)
            self._state_file.unlink(missing_ok=True)
            raise
        return bootstrap

    def _client_bootstrap(self, address: str) -> Bootstrap:
        """`address` with what a client needs to reach it; a secured broker's credentials
        and CA, also written to client.properties for other clients and tools."""
        if self.secure is None:
            return Bootstrap(address)
        credentials = self.secure.ensure(self.host)
        self.secure.write_client_properties(address, credentials)
        return Bootstrap(address, self.secure.client_settings(credentials))

    def _check_same_security(self, formatted: bool) -> None:
        """A storage formatted for one kind of listener can't serve the other: the SCRAM
        users are created when it is formatted."""
        if not formatted or (self.secure is not None) == SecureFiles(self.data_dir).exists():
            return
        asked, made = ("secured", "plain") if self.secure is not None else ("plain", "secured")
        raise BrokerError(
            f"{self.data_dir} holds a {made} broker's data; a {asked} broker needs another "
            "data directory (--data-dir)"
        )

    def _await(self, pid: int, bootstrap: str, timeout: float) -> None:
        """Return once the broker answers; raise with its log tail if it dies or times out."""
        marker = str(self._properties)
        if await_answer(bootstrap, timeout, alive=lambda: process.is_alive(pid, marker)):
            return
        if process.is_alive(pid, marker):
            what = f"is running but did not answer within {timeout:.0f} s"
        else:
            what = "exited while starting"
        raise BrokerError(
            f"Kafka broker (pid {pid}, {bootstrap}) {what}; log tail:\n{self._log_tail()}"
        )

    def _check_ports_free(self) -> None:
        """Fail early and clearly, rather than with a bind error deep in Kafka's log."""
        for port in (self.port, self.controller_port):
            with socket.socket() as sock:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                try:
                    sock.bind((self.host, port))
                except OSError as exc:
                    raise BrokerError(
                        f"port {self.host}:{port} is in use by another process: "
                        f"choose another port (--port) or stop that process"
                    ) from exc

    def _write_config(self) -> None:
        """(Re)write the config files so a changed port or a newer asset takes effect.
        A secured broker's holds the inter-broker password: readable by its owner only."""
        secure = None
        if self.secure is not None:
            secure = self.secure.broker_settings(self.secure.ensure(self.host))
        text = config.server_properties(
            self.host, self.port, self.controller_port, self.data_dir / "kafka", secure=secure
        )
        self._properties.touch(mode=0o600)
        self._properties.chmod(0o600)
        self._properties.write_text(text)
        (self.data_dir / "log4j2.yaml").write_text(jars.asset_text("log4j2.yaml"))

    def _format(self, java: str, classpath: str) -> None:
        """Format the KRaft storage once, with a fresh cluster id."""
        self._echo("formatting Kafka storage ...")
        cmd = [
            java,
            "-Xmx256m",
            "-cp",
            classpath,
            "kafka.tools.StorageTool",
            "format",
            "-t",
            config.new_cluster_id(),
            "-c",
            str(self._properties),
        ]
        if self.secure is not None:
            cmd += self.secure.scram_users(self.secure.ensure(self.host))
        done = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise BrokerError(
                f"formatting Kafka storage in {self.data_dir} failed:\n"
                f"{(done.stdout + done.stderr).strip()[-3000:]}"
            )

    def _log_tail(self, lines: int = 40) -> str:
        parts = []
        for name in ("broker.out", "broker.log"):
            path = self.data_dir / name
            if path.is_file():
                tail = path.read_text(errors="replace").splitlines()[-lines:]
                parts.append(f"--- {path} ---\n" + "\n".join(tail))
        return "\n".join(parts) or "(no log written)"

    def _read_state(self) -> dict:
        try:
            return json.loads(self._state_file.read_text())
        except (FileNotFoundError, ValueError):
            return {}

    def _write_state(self, state: dict) -> None:
        tmp = self._state_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(state))
        os.replace(tmp, self._state_file)

    @contextmanager
    def _lock(self) -> Iterator[None]:
        """Serialise start/stop of this data directory across processes."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        with open(self.data_dir / ".lock", "w") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            yield
