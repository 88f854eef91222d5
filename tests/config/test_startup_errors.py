"""Defect 12: a configuration a worker can't start from is one ConfigError naming the file
and the key, whatever the file holds: never another exception (a traceback in the CLI)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from amps_on_kafka.config import check_listen, load_config
from amps_on_kafka.config.loader import MAX_CONFIG_BYTES, MAX_ERRORS_SHOWN
from amps_on_kafka.errors import ConfigError

SECTIONS = ["Kafka", "Topics", "SOW", "Gateway", "State", "Queues"]
KEYS = [
    "Name", "Partitions", "MessageType", "Schema", "Retention", "Topic", "Key", "Expiration",
    "Listen", "MaxFrameBytes", "WriteBufferBytes", "FlushEvery", "UnderlyingTopic",
    "LeasePeriod", "Priority", "BarrierExpression", "BootstrapServers", "DeadLetterTopic",
]  # fmt: skip
scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(),
    st.text(max_size=12),
    st.sampled_from(["/id", "30s", "avro", "json", "x:1", ".inf", "orders", "/a = 1"]),
)
values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(st.sampled_from(KEYS) | st.text(max_size=5), inner, max_size=4)
    ),
    max_leaves=12,
)
FIXTURE_OK = [HealthCheck.function_scoped_fixture]  # tmp_path: one file, rewritten each time
documents = st.dictionaries(st.sampled_from(SECTIONS) | st.text(max_size=5), values, max_size=4)


@settings(max_examples=300, deadline=None, suppress_health_check=FIXTURE_OK)
@given(document=documents)
def test_any_yaml_document_loads_or_is_a_config_error_naming_the_file(tmp_path, document):
    path = tmp_path / "amps.yaml"
    path.write_text(yaml.safe_dump(document))
    try:
        load_config(path)
    except ConfigError as exc:
        assert str(exc).startswith(f"{path}: ") and "\n" not in str(exc)


@settings(max_examples=300, deadline=None, suppress_health_check=FIXTURE_OK)
@given(raw=st.binary(max_size=200))
def test_any_bytes_load_or_are_a_one_line_config_error(tmp_path, raw):
    path = tmp_path / "amps.yaml"
    path.write_bytes(raw)
    try:
        load_config(path)
    except ConfigError as exc:
        assert str(exc).startswith(f"{path}: ") and "\n" not in str(exc)


@pytest.mark.parametrize(
    ("text", "complaint"),
    [
        ("Topics: [\n", "not valid YAML: expected the node content"),
        ("Topics:\n  - Name: a\n\tPartitions: 2\n", "found character '\\t'"),
        ("[" * 5000, "nested too deeply"),
    ],
)
def test_yaml_errors_are_one_line_with_the_position(tmp_path, text, complaint):
    """PyYAML's own message spans lines with a snippet; a nesting deeper than Python's
    recursion limit raised RecursionError, a traceback."""
    path = tmp_path / "amps.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    assert complaint in str(caught.value) and "\n" not in str(caught.value)


def test_an_endless_file_is_refused_after_the_size_limit_not_read_forever():
    """`--config /dev/zero` read until memory ran out."""
    with pytest.raises(ConfigError, match=f"larger than {MAX_CONFIG_BYTES} bytes"):
        load_config("/dev/zero")


def test_a_file_wrong_everywhere_names_the_first_errors_and_counts_the_rest(tmp_path):
    path = tmp_path / "amps.yaml"
    path.write_text(yaml.safe_dump({"Topics": [{"Name": "a", "Partitions": "x"}] * 30}))
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    message = str(caught.value)
    assert "Topics[9].Partitions" in message and "Topics[10]" not in message
    assert message.endswith(f"and {30 - MAX_ERRORS_SHOWN} more errors")


def test_a_config_that_is_not_utf8_is_a_config_error(tmp_path):
    """It raised UnicodeDecodeError, a traceback."""
    path = tmp_path / "amps.yaml"
    path.write_bytes(b"\xff\xfeTopics: []\n")
    with pytest.raises(ConfigError, match=r"not UTF-8 text \(byte 0xff at 0\)"):
        load_config(path)


@pytest.mark.parametrize(
    "listen", ["nowhere", "host:", "host:port", "h:65536", "h:-1", "a b:1", ""]
)
def test_a_bad_gateway_listen_is_a_config_error_naming_the_key(tmp_path, listen):
    """`Listen: nowhere` passed the load and ended as a ValueError traceback from the
    gateway, after the worker had recovered its stores."""
    path = tmp_path / "amps.yaml"
    path.write_text(yaml.safe_dump({"Gateway": {"Listen": listen}}))
    with pytest.raises(ConfigError, match=r"Gateway\.Listen: .* is not HOST:PORT"):
        load_config(path)


@given(
    host=st.sampled_from(["", "127.0.0.1", "localhost", "::1", "[::1]", "0.0.0.0", "gw.example"]),
    port=st.integers(min_value=0, max_value=65_535),
)
def test_every_host_and_port_in_range_is_a_listen_address(host, port):
    assert check_listen(f"{host}:{port}") == f"{host}:{port}"


@given(
    host=st.text(max_size=10),
    port=st.one_of(
        st.integers(min_value=65_536), st.integers(max_value=-1), st.text(max_size=6)
    ).map(str),
)
def test_check_listen_accepts_only_a_decimal_port_up_to_65535(host, port):
    address = f"{host}:{port}"
    valid_port = port.isascii() and port.isdigit() and int(port) <= 65_535
    try:
        check_listen(address)
    except ValueError as exc:
        assert repr(address) in str(exc)
        assert not valid_port or any(c.isspace() for c in host)
    else:
        assert valid_port


def test_the_example_config_s_listen_is_valid():
    example = Path(__file__).parents[2] / "config" / "example.yaml"
    assert load_config(example).gateway.listen == "127.0.0.1:9007"
