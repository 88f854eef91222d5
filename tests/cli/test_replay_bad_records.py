"""Issue 13, defect 11: `amps-kafka replay` gets through a log that holds bad records, and
its output carries what every delete deletes, so a replay folds into the SOW.

The bad records are written straight to Kafka, as any producer may: a payload that is
not JSON, and an envelope header that does not decode.
"""

from __future__ import annotations

import base64
import io

import orjson
import pytest
from click.testing import CliRunner
from confluent_kafka import Producer
from hypothesis import given
from hypothesis import strategies as st

from amps_on_kafka.cli.replay import Undecodable, _jsonl, replay
from amps_on_kafka.config.model import SowConfig
from amps_on_kafka.expr import compile_filter
from amps_on_kafka.log.codecs import JSON, AvroCodec
from amps_on_kafka.log.envelope import H_COMMAND, H_EXPIRATION
from amps_on_kafka.log.keys import KeyExtractor
from amps_on_kafka.log.message import LogMessage
from amps_on_kafka.log.replay import Replay
from amps_on_kafka.state.sow import Applied, DictState, SowRules

BAD_JSON = b'{"id": 5, "v": '
BAD_HEADER = (H_EXPIRATION, b"soon")  # an expiration that is no number


def produce_raw(bootstrap: str, topic: str, records: list[tuple[bytes, list]]) -> None:
    """Records as a foreign producer writes them: no envelope checks, one partition."""
    producer = Producer({"bootstrap.servers": bootstrap})
    for value, headers in records:
        producer.produce(topic, value, partition=0, headers=headers)
    assert producer.flush(30) == 0


@pytest.fixture
def spoiled(bootstrap, client, topic_factory) -> str:
    """A one-partition topic: good, not JSON, good, bad header, good."""
    topic = topic_factory(1, key=("/id",))
    client.publish(topic, {"id": 1, "v": 1})
    client.publish_flush(30)
    produce_raw(bootstrap, topic, [(BAD_JSON, [])])
    client.publish(topic, {"id": 2, "v": 2})
    client.publish_flush(30)
    produce_raw(bootstrap, topic, [(b'{"id": 3}', [BAD_HEADER])])
    client.publish(topic, {"id": 4, "v": 4})
    client.publish_flush(30)
    return topic


def cli(bootstrap: str, topic: str, *args: str):
    return CliRunner().invoke(replay, [topic, "-b", bootstrap, *args], catch_exceptions=False)


def jsonl(text: str) -> list[dict]:
    return [orjson.loads(line) for line in text.splitlines()]


def test_replay_prints_undecodable_records_raw_by_default_and_goes_on(bootstrap, spoiled):
    """Defect 11: the replay used to end at the first bad record (`payload is not valid
    JSON`). By default each bad record is a line with its bookmark, the reason and its
    value in base64, the replay reaches the end, exits 0, and counts them on stderr."""
    result = cli(bootstrap, spoiled)
    assert result.exit_code == 0, result.output
    lines = jsonl(result.stdout)
    assert [line["bookmark"] for line in lines] == [f"{spoiled}|0|{n}|" for n in range(5)]
    assert [line["data"]["id"] for line in lines if "data" in line] == [1, 2, 4]
    bad_json, bad_header = lines[1], lines[3]
    assert "not valid JSON" in bad_json["error"]
    assert base64.b64decode(bad_json["raw"]) == BAD_JSON
    assert f"header {H_EXPIRATION!r}" in bad_header["error"]
    assert base64.b64decode(bad_header["raw"]) == b'{"id": 3}'
    assert "data" not in bad_json and "data" not in bad_header
    assert f"2 record(s) did not decode, printed as undecodable; the first at {spoiled}|0|1|" in (
        result.stderr
    )


def test_replay_on_error_skip_counts_the_bad_records_on_stderr(bootstrap, spoiled):
    result = cli(bootstrap, spoiled, "--on-error", "skip")
    assert result.exit_code == 0, result.output
    assert [line["data"]["id"] for line in jsonl(result.stdout)] == [1, 2, 4]
    assert "2 record(s) did not decode, skipped" in result.stderr


def test_replay_on_error_stop_ends_non_zero_at_the_first_bad_record(bootstrap, spoiled):
    result = cli(bootstrap, spoiled, "--on-error", "stop")
    assert result.exit_code == 1
    assert [line["data"]["id"] for line in jsonl(result.stdout)] == [1]
    assert f"record {spoiled}|0|1| does not decode: payload is not valid JSON" in result.stderr


def test_replay_with_conflation_gets_past_a_record_whose_headers_do_not_decode(bootstrap, spoiled):
    """The conflator reads each record's key from its headers: an unreadable header used
    to end the conflated replay; the record now passes unconflated and is printed raw."""
    result = cli(bootstrap, spoiled, "--conflate", "5s")
    assert result.exit_code == 0, result.output
    lines = jsonl(result.stdout)
    assert sorted(line["bookmark"] for line in lines) == [f"{spoiled}|0|{n}|" for n in range(5)]
    assert sum("error" in line for line in lines) == 2


def test_replayed_deletes_carry_their_keys_and_filters(bootstrap, client, topic_factory):
    """Defect 11: a delete by key printed `"data": null` and no keys."""
    topic = topic_factory(1, key=("/id",))
    client.sow_delete(topic, keys=["1", "2"])
    client.sow_delete(topic, filter="/v > 1")
    client.publish_flush(30)
    lines = jsonl(cli(bootstrap, topic).stdout)
    assert [(line["command"], line.get("sow_keys"), line.get("filter")) for line in lines] == [
        ("sow_delete", ["1"], None),
        ("sow_delete", ["2"], None),
        ("sow_delete", None, "/v > 1"),
    ]


# -- a replay folds into the SOW ---------------------------------------------------------

KEY = KeyExtractor(("/id",))


def fold(lines: list[dict]) -> dict[str, dict]:
    """The SOW a user computes from the CLI's output alone, partition by partition (a
    key lives in one partition; a delete by filter goes to each), skipping bad lines."""
    sows: dict[str, dict[str, dict]] = {}
    for line in lines:
        if "error" in line:
            continue
        sow = sows.setdefault(line["bookmark"].split("|")[1], {})
        command, data = line["command"], line["data"]
        if command == "publish":
            sow[KEY(data)] = data
        elif command == "delta_publish":
            sow[KEY(data)] = {**sow.get(KEY(data), {}), **data}
        elif "sow_keys" in line:
            for key in line["sow_keys"]:
                sow.pop(key, None)
        elif "filter" in line:
            matches = compile_filter(line["filter"]).matches
            for key in [k for k, record in sow.items() if matches(record)]:
                del sow[key]
        else:
            sow.pop(KEY(data), None)
    return {key: record for sow in sows.values() for key, record in sow.items()}


def sow_by_the_rules(bootstrap: str, topic: str) -> dict[str, dict]:
    """The SOW the worker's rules (state/sow.py) make of the same log."""
    rules = SowRules(SowConfig.model_validate({"Topic": topic, "Key": "/id"}), JSON)
    states: dict[int, DictState] = {}
    with Replay(bootstrap, topic, "0", until="0|1|") as log:
        for message in log:
            if isinstance(message, LogMessage):
                state = states.setdefault(message.partition, DictState())
                rules.apply(state, message, Applied())
    return {r.sow_key: r.data for state in states.values() for r in state.current()}


def test_a_replay_folds_into_the_sow_the_worker_rules_make(bootstrap, client, topic_factory):
    """Publishes, deltas, deletes by key, by filter and by data, and bad records: the
    fold of `amps-kafka replay` output is the SOW state/sow.py makes of the log."""
    topic = topic_factory(2, key=("/id",))
    for n in range(12):
        client.publish(topic, {"id": n, "v": n % 4, "name": f"n{n}"})
    client.delta_publish(topic, {"id": 3, "v": 9})
    client.sow_delete(topic, keys=["1", "4"])
    client.sow_delete(topic, filter="/v = 2")
    client.sow_delete(topic, data={"id": 7})
    client.delta_publish(topic, {"id": 6, "name": "back"})  # deleted by the filter: a new one
    client.publish_flush(30)
    produce_raw(bootstrap, topic, [(BAD_JSON, []), (b'{"id": 0}', [(H_COMMAND, b"erase")])])
    result = cli(bootstrap, topic)
    assert result.exit_code == 0, result.output
    folded = fold(jsonl(result.stdout))
    assert folded == sow_by_the_rules(bootstrap, topic)
    assert set(folded) == {"0", "3", "5", "6", "8", "9", "11"}
    assert folded["3"]["v"] == 9 and folded["6"] == {"id": 6, "name": "back"}


# -- any record: one line, never a crash ------------------------------------------------------

INT64 = st.integers(-(2**63), 2**63 - 1)
ENVELOPE_NAMES = ("c", "t", "k", "e", "p", "s", "x", "m", "f", "ks", "zz")
HEADERS = st.lists(
    st.tuples(st.sampled_from(ENVELOPE_NAMES), st.one_of(st.none(), st.binary(max_size=12))),
    max_size=4,
)
VALUES = st.one_of(
    st.none(),
    st.binary(max_size=24),
    st.builds(orjson.dumps, st.dictionaries(st.sampled_from("abid"), INT64, max_size=3)),
)


@given(value=VALUES, headers=HEADERS)
def test_any_record_is_one_jsonl_line_in_raw_mode(value, headers):
    """Whatever a producer wrote, `--on-error raw` prints exactly one JSON line for it:
    the message, or its bookmark with the reason and its value in base64."""
    message = LogMessage("t", 0, 7, 1_763_850_000_000, value, headers, JSON)
    out = io.BytesIO()
    write = Undecodable("raw").guard(_jsonl)
    write(out, message)
    (line,) = out.getvalue().splitlines()
    printed = orjson.loads(line)
    assert printed["bookmark"] == "t|0|7|"
    if "error" in printed:
        assert printed["raw"] == (None if value is None else base64.b64encode(value).decode())
    else:
        assert printed["data"] == (None if value is None else orjson.loads(value))


def test_bytes_inside_an_avro_payload_print_as_base64():
    """An Avro `bytes` field made the jsonl line fail with a TypeError traceback."""
    codec = AvroCodec({"type": "record", "name": "r", "fields": [{"name": "b", "type": "bytes"}]})
    message = LogMessage("t", 0, 1, 0, codec.encode({"b": b"\xff\x00"}), None, codec)
    out = io.BytesIO()
    _jsonl(out, message)
    assert orjson.loads(out.getvalue())["data"] == {"b": {"base64": "/wA="}}
