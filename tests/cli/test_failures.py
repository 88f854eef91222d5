"""Defect 12: every way `amps-kafka` can fail to start ends in one clear line and the exit
code docs/operations.md lists (1 runtime error, 2 usage error, 130 Ctrl-C), never a
traceback. The real command runs as a subprocess: the exit code and the shape of stderr
are what is under test."""

from __future__ import annotations

import logging
import os
import queue
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest
from confluent_kafka import TopicPartition

from amps_on_kafka.broker import LocalBroker
from amps_on_kafka.broker.testing import free_ports
from amps_on_kafka.cli.common import PROBE_TIMEOUT
from amps_on_kafka.config import load_config
from amps_on_kafka.errors import TransportError
from amps_on_kafka.log.kafka import reader
from amps_on_kafka.processor.queues import QueueEngine
from amps_on_kafka.processor.startup import StateDirBusy, StateDirLock

# The console script installed beside this interpreter (the venv's), else on PATH.
AMPS_KAFKA = shutil.which("amps-kafka", path=str(Path(sys.executable).parent)) or "amps-kafka"
READY_TIMEOUT = 90.0  # a worker on a busy CI machine: recovering its stores, joining the group


def amps_kafka(*args: str, bootstrap: str | None = None, timeout: float = 60.0):
    """Run the command to its end; (exit code, stdout, stderr, seconds)."""
    started = time.monotonic()
    done = subprocess.run(
        [AMPS_KAFKA, *args],
        env=_env(bootstrap),
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )
    return done.returncode, done.stdout, done.stderr, time.monotonic() - started


def _env(bootstrap: str | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "KAFKA_BOOTSTRAP_SERVERS"}
    if bootstrap is not None:
        env["KAFKA_BOOTSTRAP_SERVERS"] = bootstrap
    return env


def one_error_line(stderr: str) -> str:
    """The whole of stderr, which must be a single `Error: ...` line."""
    assert "Traceback" not in stderr, stderr
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), stderr
    return lines[0]


# The tests' clients log on anonymously. A config that lets nobody log on is warned of
# once the gateway serves, so a start that fails says one line all the same (the queue
# and Avro cases below declare no Authentication).
ANONYMOUS = "Authentication:\n  Anonymous: true\n"


def write_config(tmp_path: Path, text: str) -> str:
    path = tmp_path / f"amps-{uuid.uuid4().hex[:6]}.yaml"
    path.write_text(text)
    return str(path)


def sow_yaml(topic: str) -> str:
    topics = f"Topics:\n  - Name: {topic}\n    Partitions: 2\n"
    sow = f"SOW:\n  - Topic: {topic}\n    Key: /id\n"
    return topics + sow + ANONYMOUS  # clients log on anonymously


class Running:
    """A command running in the background, its stderr read line by line as it comes."""

    def __init__(self, *args: str, bootstrap: str, cwd: Path | None = None) -> None:
        self.process = subprocess.Popen(
            [AMPS_KAFKA, *args],
            cwd=cwd,
            env=_env(bootstrap),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.stderr: list[str] = []
        self.stdout: queue.Queue[str] = queue.Queue()
        self._lines: queue.Queue[str] = queue.Queue()
        self._pumps = [
            threading.Thread(target=_pump, args=(stream, sink), daemon=True)
            for stream, sink in (
                (self.process.stderr, self._lines),
                (self.process.stdout, self.stdout),
            )
        ]
        for pump in self._pumps:
            pump.start()

    def wait_for(self, text: str, timeout: float = READY_TIMEOUT) -> str:
        """The first stderr line containing `text` (failing if the command ends first)."""
        deadline = time.monotonic() + timeout
        while (remaining := deadline - time.monotonic()) > 0:
            try:
                line = self._lines.get(timeout=min(remaining, 0.5))
            except queue.Empty:
                if self._pumps[0].is_alive():
                    continue
                break  # stderr closed: the command has ended
            self.stderr.append(line)
            if text in line:
                return line
        pytest.fail(f"no {text!r} on stderr; exit {self.process.poll()}: {''.join(self.stderr)}")

    def interrupt(self, signum: int = signal.SIGINT, timeout: float = 60.0) -> tuple[int, str]:
        """Send `signum`; the exit code and the rest of stderr."""
        self.process.send_signal(signum)
        code = self.process.wait(timeout)
        self._pumps[0].join(timeout)  # stderr read to its end
        while not self._lines.empty():
            self.stderr.append(self._lines.get())
        return code, "".join(self.stderr)

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()


def _pump(stream, sink: queue.Queue[str]) -> None:
    for line in stream:
        sink.put(line)


# -- the defect's own cases -----------------------------------------------------------------
def test_a_gateway_listen_of_nowhere_is_a_config_error_naming_the_key(bootstrap, tmp_path):
    """It was a ValueError traceback from the gateway, after the stores had recovered."""
    config = write_config(tmp_path, "Gateway:\n  Listen: nowhere\n" + sow_yaml("t"))
    code, _, stderr, _ = amps_kafka("worker", "--config", config, bootstrap=bootstrap)
    assert code == 1
    assert "Gateway.Listen: 'nowhere' is not HOST:PORT" in one_error_line(stderr)


@pytest.mark.parametrize(
    ("option", "value"), [("--log-level", "LOUD"), ("--listen", "nowhere"), ("--listen", "h:70000")]
)
def test_a_bad_worker_option_is_a_usage_error(tmp_path, option, value):
    """`--log-level LOUD` was a ValueError traceback from logging."""
    config = write_config(tmp_path, sow_yaml("t"))
    code, _, stderr, _ = amps_kafka("worker", "--config", config, option, value)
    assert code == 2 and "Traceback" not in stderr
    assert f"Invalid value for '{option}'" in stderr


def test_log_level_is_case_insensitive(tmp_path):
    config = write_config(tmp_path, "Topics: []\n")  # refused after the option is accepted
    code, _, stderr, _ = amps_kafka("worker", "--config", config, "--log-level", "debug")
    assert code == 1 and "no SOW topic and no queue" in one_error_line(stderr)


def test_an_empty_config_refuses_to_start_a_worker_that_would_serve_nothing(tmp_path):
    """It started a worker with nothing to serve. Refused before Kafka is even asked."""
    config = write_config(tmp_path, "Topics:\n  - Name: orders\n")
    code, _, stderr, _ = amps_kafka("worker", "--config", config)
    assert code == 1
    assert f"{config} has no SOW topic and no queue" in one_error_line(stderr)


def test_a_queue_whose_underlying_topic_matches_nothing_is_named_within_seconds(
    bootstrap, tmp_path
):
    """It logged a traceback, then "not ready after 60 s"."""
    pattern = f"nothing-{uuid.uuid4().hex[:8]}-.*"
    queue = f"Queues:\n  - Name: work\n    UnderlyingTopic: {pattern}\n"
    config = write_config(tmp_path, queue)
    code, _, stderr, seconds = amps_kafka(
        "worker", "--config", config, "--state-dir", str(tmp_path / "s"), bootstrap=bootstrap
    )
    assert code == 1
    line = one_error_line(stderr)
    assert f"queue work: no topic matches UnderlyingTopic '{pattern}'" in line
    assert seconds < 15


def test_a_queue_engine_over_nothing_fails_with_one_log_line_and_no_traceback(
    bootstrap, tmp_path, caplog
):
    """A QueueEngine started without the worker's startup check (a library user, or a
    topic deleted meanwhile) logged a traceback and said "queue work: queue work: ..."."""
    pattern = f"nothing-{uuid.uuid4().hex[:8]}-.*"
    config = load_config(
        write_config(tmp_path, f"Queues:\n  - Name: work\n    UnderlyingTopic: {pattern}\n")
    )
    engine = QueueEngine(config, bootstrap, tmp_path / "state")
    engine.start()
    try:
        with pytest.raises(TransportError) as caught:
            engine.wait_ready(timeout=30)
    finally:
        engine.stop()
    assert caught.value.reason == f"queue work: no topic matches UnderlyingTopic '{pattern}'"
    failed = [r for r in caplog.records if "queue work failed" in r.getMessage()]
    assert len(failed) == 1 and failed[0].exc_info is None


def test_a_sow_topic_missing_from_kafka_is_named(bootstrap, tmp_path):
    """It waited 60 s for partitions that could never come ("not ready after 60 s")."""
    missing = f"missing-{uuid.uuid4().hex[:8]}"
    config = write_config(tmp_path, sow_yaml(missing))
    code, _, stderr, _ = amps_kafka(
        "worker", "--config", config, "--state-dir", str(tmp_path / "s"), bootstrap=bootstrap
    )
    assert code == 1
    assert f"SOW topic '{missing}' does not exist on Kafka" in one_error_line(stderr)


@pytest.mark.timing
@pytest.mark.parametrize(
    "command",
    [
        ("topics", "list"),
        ("replay", "orders"),
        ("publish", "orders", '{"id": 1}'),
        ("log", "info"),
        ("bookmark", "resolve", "orders", "0"),
        ("worker", "--config", "{config}"),
    ],
    ids=lambda command: command[0],
)
def test_an_unreachable_broker_is_one_line_naming_it_within_5_s(tmp_path, command):
    """It printed 200-460 raw librdkafka lines and took 10-20 s before the error."""
    (port,) = free_ports(1)  # nothing listens there
    address = f"127.0.0.1:{port}"
    config = write_config(tmp_path, sow_yaml("orders"))
    args = [part.replace("{config}", config) for part in command]
    code, _, stderr, seconds = amps_kafka(*args, "--bootstrap", address)
    assert code == 1
    assert f"no Kafka broker answers at {address} (connection refused)" in one_error_line(stderr)
    assert seconds < 5.0


@pytest.mark.timing
def test_a_listener_that_never_answers_is_given_up_after_the_probe_timeout(tmp_path):
    """Something accepts the connection but never answers Kafka's protocol (a wrong port,
    a proxy): the metadata probe gives up after PROBE_TIMEOUT, not librdkafka's 10-20 s."""
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        address = f"127.0.0.1:{silent.getsockname()[1]}"
        code, _, stderr, seconds = amps_kafka("topics", "list", "--bootstrap", address)
    assert code == 1
    line = one_error_line(stderr)
    assert f"no Kafka broker answers at {address} (waited {PROBE_TIMEOUT:.0f} s)" in line
    assert PROBE_TIMEOUT <= seconds < PROBE_TIMEOUT + 10  # + the interpreter's start


def test_librdkafka_lines_go_to_python_logging_at_debug_not_to_stderr(capfd, caplog):
    """librdkafka wrote a raw line to stderr per failed reconnect: hundreds before an
    unreachable broker's one-line error."""
    (port,) = free_ports(1)
    caplog.set_level(logging.DEBUG, logger="amps_on_kafka.librdkafka")
    consumer = reader(f"127.0.0.1:{port}")
    try:
        consumer.assign([TopicPartition("t", 0, 0)])
        deadline = time.monotonic() + 30
        while not caplog.records and time.monotonic() < deadline:
            consumer.consume(1, timeout=0.2)  # serves the log queue
    finally:
        consumer.close()
    refused = [r for r in caplog.records if "Connection refused" in r.getMessage()]
    assert refused and all(r.levelno == logging.DEBUG for r in refused)
    assert capfd.readouterr().err == ""


# -- a second worker, and Ctrl-C ---------------------------------------------------------
@pytest.fixture
def worker(bootstrap, topic_factory, tmp_path) -> Iterator[tuple[Running, str, Path, str]]:
    """A running `amps-kafka worker`: (it, its topic, its state dir, its gateway URI)."""
    topic = topic_factory(2, key=("/id",))
    config = write_config(tmp_path, sow_yaml(topic))
    state = tmp_path / "state"
    running = Running(
        "worker", "--config", config, "--state-dir", str(state), "--listen", "127.0.0.1:0",
        "--group", f"g-{uuid.uuid4().hex[:8]}", bootstrap=bootstrap,
    )  # fmt: skip
    try:
        ready = running.wait_for("worker ready: gateway=")
        yield running, topic, state, ready.split("gateway=")[1].split()[0]
    finally:
        running.kill()


def test_a_second_worker_on_the_same_state_dir_is_one_line_naming_it_and_the_pid(
    bootstrap, worker, tmp_path
):
    """It printed two tracebacks (RocksDB's LOCK error) once a partition moved to it."""
    first, topic, state, _ = worker
    config = write_config(tmp_path, sow_yaml(topic))
    code, _, stderr, _ = amps_kafka(
        "worker", "--config", config, "--state-dir", str(state), "--listen", "127.0.0.1:0",
        bootstrap=bootstrap,
    )  # fmt: skip
    assert code == 1
    line = one_error_line(stderr)
    holder = f"(PID {first.process.pid})"
    assert f"state directory {state} is in use by another worker or rebuild {holder}" in line
    assert first.process.poll() is None  # the first one goes on


def test_a_gateway_port_in_use_ends_the_worker_with_one_error_line(
    bootstrap, topic_factory, tmp_path
):
    topic = topic_factory(1, key=("/id",))
    config = write_config(tmp_path, sow_yaml(topic))
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        listen = f"127.0.0.1:{taken.getsockname()[1]}"
        code, _, stderr, _ = amps_kafka(
            "worker", "--config", config, "--state-dir", str(tmp_path / "s"), "--listen", listen,
            bootstrap=bootstrap,
        )  # fmt: skip
    assert code == 1 and "Traceback" not in stderr
    assert stderr.strip().splitlines()[-1].startswith(f"Error: gateway can't listen on {listen}")
    assert "revoked" in stderr  # the stores it had opened were closed


def test_a_damaged_store_ends_the_worker_with_its_reason_and_no_traceback(
    bootstrap, topic_factory, tmp_path
):
    """The worker thread logged the failure's traceback, then printed it a second time
    as an uncaught exception in thread amps-worker, before the one line that mattered."""
    topic = topic_factory(1, key=("/id",))
    config = write_config(tmp_path, sow_yaml(topic))
    state = tmp_path / "state"
    (state / topic / "0").mkdir(parents=True)
    (state / topic / "0" / "CURRENT").write_text("garbage\n")  # RocksDB can't open it
    code, _, stderr, _ = amps_kafka(
        "worker", "--config", config, "--state-dir", str(state), bootstrap=bootstrap
    )
    assert code == 1 and "Traceback" not in stderr and "Exception in thread" not in stderr
    last = stderr.strip().splitlines()[-1]
    assert last.startswith(f"Error: worker failed: the store {state / topic / '0'} is damaged")


def test_spark_rebuild_refuses_a_state_dir_a_worker_holds(bootstrap, worker, tmp_path):
    """It checked only the stores the worker had open: a partition assigned to the worker
    during the rebuild met stores being replaced."""
    pytest.importorskip("pyspark", reason="the spark extra")
    first, topic, state, _ = worker
    config = write_config(tmp_path, sow_yaml(topic))
    code, _, stderr, _ = amps_kafka(
        "spark", "rebuild", topic, "--state-dir", str(state), "--config", config,
        bootstrap=bootstrap,
    )  # fmt: skip
    assert code == 1
    assert f"is in use by another worker or rebuild (PID {first.process.pid})" in one_error_line(
        stderr
    )


def test_a_killed_worker_leaves_no_stale_lock_on_its_state_dir(tmp_path):
    """The kernel drops a flock with its process: SIGKILL must not leave the directory
    locked for good, as a PID file would."""
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD_LOCK, str(tmp_path)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout.readline().strip() == "locked"  # type: ignore[union-attr]
        with pytest.raises(StateDirBusy, match=f"PID {holder.pid}"):
            StateDirLock(tmp_path).acquire()
    finally:
        holder.kill()
        holder.wait()
    with StateDirLock(tmp_path):
        assert (tmp_path / "worker.lock").read_text() == f"{os.getpid()}\n"


HOLD_LOCK = """
import sys, threading
from pathlib import Path
from amps_on_kafka.processor.startup import StateDirLock
lock = StateDirLock(Path(sys.argv[1]))
lock.acquire()
print("locked", flush=True)
threading.Event().wait()
"""


def test_a_state_dir_that_is_a_file_is_one_line(bootstrap, tmp_path):
    config = write_config(tmp_path, sow_yaml("t"))
    (tmp_path / "state").write_text("not a directory")
    code, _, stderr, _ = amps_kafka(
        "worker", "--config", config, "--state-dir", str(tmp_path / "state"), bootstrap=bootstrap
    )
    assert code == 1
    assert f"can't use {tmp_path / 'state'} as a state directory" in one_error_line(stderr)


def test_a_reader_that_goes_away_ends_the_output_quietly_with_exit_code_141(
    bootstrap, topic_factory
):
    """`amps-kafka replay T | head -1` printed "Error: Broken pipe" and exited 1."""
    topic = topic_factory(1)
    lines = "".join(f'{{"n": {n}, "pad": "{"x" * 100}"}}\n' for n in range(2000))
    subprocess.run(
        [AMPS_KAFKA, "publish", topic], input=lines, text=True, env=_env(bootstrap), check=True
    )
    replay = subprocess.Popen(  # more than a pipe's buffer
        [AMPS_KAFKA, "replay", topic, "--bookmark", "0"],
        env=_env(bootstrap),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert replay.stdout is not None and replay.stdout.readline().startswith('{"bookmark"')
    replay.stdout.close()
    _, stderr = replay.communicate(timeout=60)
    assert (replay.returncode, stderr) == (141, "")


def test_ctrl_c_stops_the_worker_cleanly_with_exit_code_130(worker):
    running, _, _, _ = worker
    code, stderr = running.interrupt(signal.SIGINT)
    assert code == 130
    assert "Traceback" not in stderr and "revoked" in stderr  # its stores were closed


def test_sigterm_stops_the_worker_cleanly_with_exit_code_0(worker):
    running, _, _, _ = worker
    code, stderr = running.interrupt(signal.SIGTERM)
    assert code == 0
    assert "Traceback" not in stderr and "revoked" in stderr


def test_ctrl_c_while_the_commands_load_exits_130_without_a_traceback():
    """Loading the sub-commands takes up to a second or two: a Ctrl-C then printed the
    traceback of whatever import it interrupted. The interrupt is raised from inside the
    import of one sub-command, where a Ctrl-C at that moment would land."""
    done = subprocess.run(
        [sys.executable, "-c", INTERRUPT_WHILE_LOADING], capture_output=True, text=True
    )
    assert done.returncode == 130 and done.stderr == ""


INTERRUPT_WHILE_LOADING = """
import sys

class CtrlC:
    def find_spec(self, name, path=None, target=None):
        if name == "amps_on_kafka.cli.worker":
            raise KeyboardInterrupt

sys.meta_path.insert(0, CtrlC())
from amps_on_kafka.cli import main
"""


def test_ctrl_c_stops_subscribe_with_exit_code_130_and_no_traceback(bootstrap, worker):
    """click's own handling printed "Aborted!" and exited 1, like a failure."""
    _, topic, _, server = worker
    subscriber = Running("subscribe", topic, "--server", server, bootstrap=bootstrap)
    try:
        marker = uuid.uuid4().hex
        published = None
        deadline = time.monotonic() + READY_TIMEOUT
        while published is None and time.monotonic() < deadline:  # live once it prints one
            assert amps_kafka("publish", topic, f'{{"id": 1, "m": "{marker}"}}',
                              bootstrap=bootstrap)[0] == 0  # fmt: skip
            try:
                published = orjson.loads(subscriber.stdout.get(timeout=5.0))
            except queue.Empty:
                continue
        assert published is not None and published["data"]["m"] == marker
        code, stderr = subscriber.interrupt(signal.SIGINT)
        assert code == 130
        assert "Traceback" not in stderr and "Aborted" not in stderr
    finally:
        subscriber.kill()


# -- the rest of the kind: every command, bad files and arguments --------------------------
@pytest.mark.parametrize(
    ("text", "complaint"),
    [
        ("Topics: [\n", "not valid YAML: expected the node content"),
        ("Topics:\n  - Name: t\n    Partitions: many\n", "Topics[0].Partitions"),
        (
            "Topics:\n  - Name: t\n    MessageType: avro\n    Schema: absent.avsc\n"
            "SOW:\n  - Topic: t\n    Key: /id\n",
            "can't read Avro schema",
        ),
        ("SOW:\n  - Topic: t\n    Key: 7\n", "SOW[0].Key"),
    ],
    ids=["yaml-syntax", "wrong-type", "missing-avro-schema", "key-not-a-path"],
)
@pytest.mark.parametrize("command", ["worker", "topics create"])
def test_a_bad_config_file_is_one_line_for_every_command_that_reads_one(
    bootstrap, tmp_path, text, complaint, command
):
    config = write_config(tmp_path, text)
    state = ["--state-dir", str(tmp_path / "s")] if command == "worker" else []
    args = [*command.split(), "--config", config, *state]
    code, _, stderr, _ = amps_kafka(*args, bootstrap=bootstrap)
    assert code == 1
    assert complaint in one_error_line(stderr)


@pytest.mark.parametrize("command", ["worker", "topics create"])
def test_a_missing_config_file_is_one_line(tmp_path, command):
    code, _, stderr, _ = amps_kafka(*command.split(), "--config", str(tmp_path / "absent.yaml"))
    assert code == 1
    assert "absent.yaml: can't read the configuration" in one_error_line(stderr)


@pytest.mark.parametrize(
    "args",
    [
        ("replay", "no-such-topic-{u}"),
        ("publish", "no-such-topic-{u}", '{"id": 1}'),
        ("log", "info", "no-such-topic-{u}"),
        ("log", "retention", "no-such-topic-{u}", "7d"),
        ("bookmark", "resolve", "no-such-topic-{u}", "0"),
    ],
    ids=lambda args: args[0] + "-" + args[1],
)
def test_an_unknown_topic_is_one_line_for_every_command(bootstrap, args):
    unique = uuid.uuid4().hex[:8]
    args = [arg.replace("{u}", unique) for arg in args]
    code, _, stderr, _ = amps_kafka(*args, bootstrap=bootstrap)
    assert code == 1
    assert f"'no-such-topic-{unique}' does not exist" in one_error_line(stderr)


@pytest.mark.parametrize(
    ("args", "code", "complaint"),
    [
        (("publish", "t", "{}", "--expiration", "soon"), 2, "Invalid value for '--expiration'"),
        (("replay", "t", "--rate", "fast"), 1, "rate 'fast'"),
        (("replay", "t", "--filter", "/x ="), 1, "at position 5"),
        (("bookmark", "decode", "x|y|z"), 1, "malformed bookmark"),
        (("topics", "create", "bad|name"), 1, "not a valid Kafka topic name"),
        (("topics", "create"), 2, "give either NAME or --config FILE"),
        (("log", "retention", "t", "soon"), 1, "not a duration"),
        (("sow", "t", "--server", "nonsense"), 1, "unknown scheme"),
        (("sow", "t", "--top-n", str(2**64)), 2, "Invalid value for '--top-n'"),  # a traceback
        (("ping", "--timeout", "inf"), 2, "inf is not a finite number of seconds above 0"),
        (("ping", "--timeout", "nan"), 2, "nan is not a finite number of seconds above 0"),
        (("sow", "t", "--server", "tcp://127.0.0.1:{port}/amps/json"), 1, "can't connect"),
        (("no-such-command",), 2, "No such command"),
    ],
    ids=lambda value: value[0] if isinstance(value, tuple) else None,
)
def test_bad_arguments_are_one_line_with_the_documented_exit_code(bootstrap, args, code, complaint):
    (port,) = free_ports(1)
    args = [arg.replace("{port}", str(port)) for arg in args]
    got, _, stderr, _ = amps_kafka(*args, bootstrap=bootstrap)
    assert got == code and "Traceback" not in stderr
    if code == 1:
        assert complaint in one_error_line(stderr)
    else:
        assert complaint in stderr


# -- a broker outage while the worker runs -------------------------------------------------
def test_the_worker_logs_a_kafka_outage_once_and_the_recovery_once(tmp_path):
    """It logged nothing of its own through an outage, while librdkafka printed a line per
    reconnect attempt, and nothing when Kafka came back. Its own broker: this one stops."""
    port, controller_port = free_ports(2)
    broker = LocalBroker(tmp_path / "kafka", port=port, controller_port=controller_port)
    address = broker.start()
    running = None
    try:
        config = write_config(tmp_path, sow_yaml("orders"))
        assert amps_kafka("topics", "create", "--config", config, bootstrap=address)[0] == 0
        running = Running(
            "worker", "--config", config, "--state-dir", str(tmp_path / "state"),
            "--listen", "127.0.0.1:0", bootstrap=address,
        )  # fmt: skip
        ready = running.wait_for("worker ready: gateway=")
        broker.stop()
        running.wait_for(f"Kafka unreachable at {address} since ", timeout=60)
        broker.start()
        running.wait_for(f"Kafka reachable again at {address} after ", timeout=120)
        assert amps_kafka("publish", "orders", '{"id": 7}', bootstrap=address)[0] == 0
        server = ready.split("gateway=")[1].split()[0]
        assert _sow_ids(server, "orders") == [7]  # applied after the outage
        code, stderr = running.interrupt(signal.SIGINT)
    finally:
        if running is not None:
            running.kill()
        broker.stop()
    assert code == 130 and "Traceback" not in stderr
    assert stderr.count("Kafka unreachable") == 1 and stderr.count("reachable again") == 1
    assert "rdkafka" not in stderr  # librdkafka's own lines are DEBUG, not shown at INFO


def _sow_ids(server: str, topic: str, timeout: float = 60.0) -> list[int]:
    """The ids in the worker's SOW once it holds any (the worker applies asynchronously)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        code, stdout, stderr, _ = amps_kafka("sow", topic, "--server", server)
        assert code == 0, stderr
        ids = sorted(orjson.loads(line)["data"]["id"] for line in stdout.splitlines())
        if ids:
            return ids
    return []


def test_a_worker_nobody_may_log_on_to_warns_once_its_gateway_serves(
    bootstrap, topic_factory, tmp_path
):
    """The warning comes after the start succeeded (a failed start is one line), before
    the ready line."""
    topic = topic_factory(1, key=("/id",))
    config = write_config(tmp_path, sow_yaml(topic).replace(ANONYMOUS, ""))
    running = Running(
        "worker", "--config", config, "--state-dir", str(tmp_path / "s"), "--listen",
        "127.0.0.1:0", "--group", f"g-{uuid.uuid4().hex[:8]}", bootstrap=bootstrap,
    )  # fmt: skip
    try:
        warning = running.wait_for("no user can log on")
        running.wait_for("worker ready: gateway=")
    finally:
        running.kill()
    assert "WARNING" in warning
