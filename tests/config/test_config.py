"""Configuration loading: AMPS vocabulary, durations, and errors that name file and key."""

from pathlib import Path

import pytest

from amps_on_kafka.config import load_config, parse_duration
from amps_on_kafka.errors import ConfigError

EXAMPLE = Path(__file__).parents[2] / "config" / "example.yaml"


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "amps.yaml"
    path.write_text(text)
    return path


def test_the_shipped_example_loads():
    config = load_config(EXAMPLE)
    assert config.topic("orders").partitions == 4
    assert config.sow_for("orders").key == ("/id",)
    assert config.sow_for("trades").key == ("/55", "/109")
    assert config.sow_for("trades").expiration.default_seconds == 3600
    assert config.topic("trades").schema_path.is_file()


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ("Topics:\n  - Name: orders\n    Partitions: many\n", "Topics[0].Partitions"),
        ("Topics:\n  - Name: 'a|b'\n", "Topics[0].Name"),
        ("Topics:\n  - Name: o\nSOW:\n  - Topic: o\n    Key: id\n", "SOW[0].Key"),
        (
            "Topics:\n  - Name: o\nSOW:\n  - Topic: o\n    Key: /id\n    Expirtion: 30s\n",
            "SOW[0].Expirtion",
        ),
        (
            "Topics:\n  - Name: o\nSOW:\n  - Topic: o\n    Key: /id\n    Expiration: soon\n",
            "SOW[0].Expiration",
        ),
        ("Topics:\n  - Name: o\nSOW:\n  - Topic: p\n    Key: /id\n", "SOW topic 'p'"),
        (
            "Topics: [{Name: o}]\nSOW: [{Topic: o, Key: /id}, {Topic: o, Key: /x}]\n",
            "SOW: a Topic appears twice in ['o', 'o']",  # one was silently ignored
        ),
        (  # one bad record wrote 117 letters in 5 s, each read, refused and written again
            "Topics: [{Name: o}]\nSOW: [{Topic: o, Key: /id, DeadLetterTopic: o}]\n",
            "SOW o: DeadLetterTopic 'o' is read by SOW o: letters must go to a topic nothing",
        ),
        (
            "Queues: [{Name: q, UnderlyingTopic: 'o.*', DeadLetterTopic: o.dead}]\n",
            "queue q: DeadLetterTopic 'o.dead' is read by queue q",
        ),
        ("Topics:\n  - Name: o\n    MessageType: avro\n", "needs a Schema"),
        ("State:\n  WriteBufferBytes: 1000\n", "State.WriteBufferBytes"),
        ("State:\n  FlushEvery: soon\n", "State.FlushEvery"),
        ("Topics: [\n", "not valid YAML"),
        ("- just a list\n", "top level must be a mapping"),
    ],
)
def test_errors_name_the_file_and_the_offending_key(tmp_path, text, named):
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    assert str(path) in str(caught.value)
    assert named in str(caught.value)


def test_a_missing_file_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="can't read"):
        load_config(tmp_path / "absent.yaml")


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("500ms", 0.5),
        ("30s", 30),
        ("5m", 300),
        ("1h", 3600),
        ("1d", 86400),
        ("2w", 1209600),
        ("45", 45),
        (7, 7),
    ],
)
def test_amps_durations(text, seconds):
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "soon", "-5s", "5 parsecs", True])
def test_bad_durations_are_named(text):
    with pytest.raises(ValueError, match="duration"):
        parse_duration(text)


def test_expiration_modes():
    config = load_config(EXAMPLE)
    assert config.sow_for("orders").expiration.mode == "disabled"
    assert config.sow_for("trades").expiration.mode == "enabled"
