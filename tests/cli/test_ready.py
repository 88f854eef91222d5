"""A worker says it is ready in a way a script can use: the ready file and the ready line."""

from __future__ import annotations

import re
import signal

import orjson
import pytest

from amps_on_kafka.client import Client
from amps_on_kafka.client.uri import parse_uri
from amps_on_kafka.errors import TransportError
from tests.cli.test_failures import Running, sow_yaml, write_config


def test_the_ready_file_names_the_gateway_and_goes_at_exit(bootstrap, topic_factory, tmp_path):
    topic = topic_factory(2, key=("/id",))
    ready_file = tmp_path / "worker.json"
    ready_file.write_text("stale, from a worker killed earlier")
    running = Running(
        "worker", "--config", write_config(tmp_path, sow_yaml(topic)),
        "--state-dir", "state", "--listen", "127.0.0.1:0",  # relative to the worker's cwd
        "--ready-file", str(ready_file), bootstrap=bootstrap, cwd=tmp_path,
    )  # fmt: skip
    try:
        line = running.wait_for("worker ready: ")
        info = orjson.loads(ready_file.read_bytes())
        assert info["pid"] == running.process.pid and info["admin"] is None
        # absolute, so a reader in another directory finds it (it was "state", as given)
        assert info["state_dir"] == str((tmp_path / "state").resolve())
        assert f"state={info['state_dir']}" in line
        assert line.split("gateway=")[1].split()[0] == info["gateway"]  # a naive parse works
        with Client("ready-reader") as client:
            client.connect(info["gateway"])
            client.logon()
            assert list(client.sow(topic)) == []
        code, _ = running.interrupt(signal.SIGTERM)
        assert code == 0 and not ready_file.exists()
        assert not list(tmp_path.glob(".worker.json.*"))  # no temporary file left behind
    finally:
        running.kill()


def test_a_uri_with_blanks_or_a_copied_comma_is_read_or_named():
    assert parse_uri(" tcp://127.0.0.1:9007/amps/json\n").address == "127.0.0.1:9007"
    with pytest.raises(
        TransportError, match=re.escape("did you mean 'tcp://127.0.0.1:9007/amps/json'")
    ):
        parse_uri("tcp://127.0.0.1:9007/amps/json,")
