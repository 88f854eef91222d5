"""`amps-kafka sow` and `amps-kafka subscribe` against a worker's gateway."""

from __future__ import annotations

import click
import orjson
import pytest
from click.testing import CliRunner

from amps_on_kafka.cli.sow import sow, subscribe
from tests.server.helpers import WAIT


@pytest.fixture
def run(served):
    def invoke(command: click.Command, *args: str):
        result = CliRunner().invoke(
            command, [*args, "--server", served.uri], catch_exceptions=False
        )
        return (
            result.exit_code,
            [orjson.loads(line) for line in result.output.splitlines() if line.startswith("{")],
            result.output,
        )

    return invoke


@pytest.fixture
def filled(served, client_to):
    client = client_to(served.address)
    with client.subscribe(served.topic, timeout=WAIT) as applied:
        for i in range(6):
            client.publish(served.topic, {"id": i, "qty": i * 10})
        client.publish_flush(WAIT)
        assert len([next(applied) for _ in range(6)]) == 6
    return client


def test_sow_prints_the_matching_records_as_json_lines(served, filled, run):
    code, lines, _ = run(
        sow, served.topic, "--filter", "/qty >= 20", "--order-by", "/qty DESC", "--top-n", "2"
    )
    assert code == 0
    assert [line["data"] for line in lines] == [{"id": 5, "qty": 50}, {"id": 4, "qty": 40}]
    assert lines[0]["command"] == "sow" and lines[0]["sow_key"] == "5"
    assert lines[0]["bookmark"].startswith(f"{served.topic}|") and lines[0]["timestamp"].endswith(
        "Z"
    )


def test_sow_reports_the_servers_reason(served, run):
    code, _, output = run(sow, served.topic, "--filter", "/qty >")
    assert code == 1 and "Error: at position" in output


def test_subscribe_with_sow_prints_the_snapshot_then_stops_when_idle(served, filled, run):
    code, lines, _ = run(
        subscribe, served.topic, "--sow", "--filter", "/qty < 20", "--timeout", "0.5"
    )
    assert code == 0
    assert sorted(line["sow_key"] for line in lines) == ["0", "1"]


def test_subscribe_from_a_bookmark_replays_the_log(served, filled, run):
    code, lines, _ = run(
        subscribe, served.topic, "--bookmark", "0", "--filter", "/id = 3", "--timeout", "0.5"
    )
    assert code == 0
    assert [(line["command"], line["data"]) for line in lines] == [
        ("publish", {"id": 3, "qty": 30})
    ]
    code, _, output = run(subscribe, served.topic, "--bookmark", "0", "--oof")
    assert code == 2 and "excludes --oof" in output


def test_subscribe_refuses_a_timeout_of_no_seconds_as_a_usage_error():
    """It went to the client as is, whose ValueError came out as a traceback."""
    for bad in ("0", "-1", "nan"):
        result = CliRunner().invoke(subscribe, ["t", "--timeout", bad, "--server", "tcp://h:1"])
        assert result.exit_code == 2 and "Invalid value for '--timeout'" in result.output
