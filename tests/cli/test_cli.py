"""The `amps-kafka` command as a user runs it, against the real broker."""

from __future__ import annotations

import uuid

import orjson
import pytest
from click.testing import CliRunner

from amps_on_kafka.cli import main


@pytest.fixture
def run(bootstrap, monkeypatch):
    monkeypatch.setenv("KAFKA_BOOTSTRAP_SERVERS", bootstrap)
    runner = CliRunner()

    def invoke(*args: str, stdin: str | None = None):
        return runner.invoke(main, list(args), input=stdin, catch_exceptions=False)

    return invoke


def lines(output: str) -> list[dict]:
    return [orjson.loads(line) for line in output.splitlines() if line.startswith("{")]


@pytest.fixture
def topic(run, request):
    label = "".join(c if c.isalnum() or c in "._-" else "-" for c in request.node.name[-40:])
    name = f"cli-{label}-{uuid.uuid4().hex[:6]}"  # unique even on a broker kept between runs
    result = run("topics", "create", name, "--partitions", "4", "--key", "/id")
    assert result.exit_code == 0, result.output
    docs = ({"id": i, "sym": "IBM" if i % 3 == 0 else "MSFT"} for i in range(12))
    stdin = "\n".join(orjson.dumps(doc).decode() for doc in docs)
    result = run("publish", name, stdin=stdin)
    assert result.exit_code == 0, result.output
    return name


def test_topics_create_is_rerunnable(run, topic):
    result = run("topics", "create", topic, "--partitions", "4", "--key", "/id")
    assert result.exit_code == 0 and f"{topic}: exists" in result.output


def test_replay_from_epoch_prints_each_message_once_as_jsonl(run, topic):
    result = run("replay", topic, "--bookmark", "0")
    assert result.exit_code == 0, result.output
    records = lines(result.output)
    assert sorted(r["data"]["id"] for r in records) == list(range(12))
    assert all({"bookmark", "topic", "timestamp", "data"} <= set(r) for r in records)


def test_replay_after_a_bookmark_and_with_a_filter(run, topic):
    everything = lines(run("replay", topic).output)
    first = next(r for r in everything if r["bookmark"].endswith("|0|"))
    after = lines(run("replay", topic, "--bookmark", first["bookmark"]).output)
    assert len(after) == 11 and first["bookmark"] not in {r["bookmark"] for r in after}
    ibm = lines(run("replay", topic, "--filter", "/sym = 'IBM'").output)
    assert sorted(r["data"]["id"] for r in ibm) == [0, 3, 6, 9]


def test_replay_until_a_bookmark_and_raw_format(run, topic):
    everything = lines(run("replay", topic).output)
    stop = everything[0]["bookmark"]
    partition = stop.split("|")[1]
    until = lines(run("replay", topic, "--until", stop).output)
    assert [r for r in until if r["bookmark"].split("|")[1] == partition][-1]["bookmark"] == stop
    raw = run("replay", topic, "--format", "raw").output.splitlines()
    assert len(raw) == 12 and all(orjson.loads(line)["id"] >= 0 for line in raw)


@pytest.mark.parametrize(
    ("bookmark", "complaint"),
    [
        ("nonsense", "malformed bookmark"),
        ("{topic}|7|0|", "partition 7"),
        ("{topic}|0|9999|", "past the end"),
        ("20261399T000000Z", "20261399T000000 is not a date and time (YYYYmmddTHHMMSS[Z]"),
    ],
)
def test_bad_bookmarks_are_clear_errors(run, topic, bookmark, complaint):
    result = run("replay", topic, "--bookmark", bookmark.format(topic=topic))
    assert result.exit_code != 0
    assert complaint in result.output


def test_a_bad_filter_is_an_error_before_any_message(run, topic):
    result = run("replay", topic, "--filter", "/sym = ")
    assert result.exit_code != 0 and "position" in result.output
    assert lines(result.output) == []


def test_unknown_topics_are_errors(run):
    assert "does not exist" in run("publish", "no-such-topic-xyz", '{"id": 1}').output
    assert "does not exist" in run("replay", "no-such-topic-xyz").output
    nothing = run("publish", "no-such-topic-xyz", stdin="")  # a typo, nothing piped yet
    assert nothing.exit_code == 1 and "does not exist" in nothing.output


def test_a_bookmark_past_an_empty_partition_says_it_holds_nothing(run, topic_factory):
    topic = topic_factory(1)
    result = run("replay", topic, "--bookmark", f"{topic}|0|0|")
    assert result.exit_code == 1
    assert f"past the end of the log ({topic}|0 holds no record yet)" in result.output


def test_a_server_without_a_scheme_is_shown_the_uris_it_may_mean(run):
    result = run("sow", "orders", "--server", "127.0.0.1:9007")
    assert result.exit_code == 1
    assert "e.g. tcp://127.0.0.1:9007/amps/json for a gateway" in result.output


def test_bookmark_decode_and_resolve(run, topic):
    decoded = run("bookmark", "decode", f"{topic}|2|5|").output
    assert "partition=2 offset=5" in decoded
    resolved = run("bookmark", "resolve", topic, "0").output.splitlines()
    assert len(resolved) == 4 and all("start=0" in line for line in resolved)


def test_publish_with_expiration_carries_it(run, topic):
    assert run("publish", topic, '{"id": 99}', "--expiration", "30").exit_code == 0
    result = run("replay", topic, "--filter", "/id = 99")
    assert lines(result.output)[0]["data"] == {"id": 99}
