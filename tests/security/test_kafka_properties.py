"""Kafka client properties without a broker: reading them, resolving secrets, hiding them."""

from __future__ import annotations

import pickle
import string

import pytest
from hypothesis import given
from hypothesis import strategies as st

from amps_on_kafka.config import Config, load_config
from amps_on_kafka.config.properties import (
    MAX_PROPERTIES_FILE_BYTES,
    MAX_SECRET_FILE_BYTES,
    REDACTED,
    is_secret,
    read_properties_file,
    redacted,
    resolve_all,
    scrub,
)
from amps_on_kafka.errors import ConfigError
from amps_on_kafka.log.kafka import Bootstrap, client_config, with_properties

SECRET = "hunter2-\u00e9-s3cr3t"  # non-ASCII on purpose: files and env are UTF-8


def test_a_properties_file_is_read_as_kafka_tools_read_it(tmp_path, monkeypatch):
    monkeypatch.setenv("AMPS_TEST_PASSWORD", SECRET)
    (tmp_path / "key.txt").write_text("file-secret\n")
    path = tmp_path / "client.properties"
    path.write_text(
        "# a comment\n! another\n"
        "security.protocol = SASL_SSL\n"
        "sasl.mechanisms: SCRAM-SHA-512\n"
        "sasl.jaas.config=org.example.Login required \\\n"
        '    username="u";\n'
        "sasl.password=${env:AMPS_TEST_PASSWORD}\n"
        f"ssl.key.password=pre-${{file:{tmp_path / 'key.txt'}}}-post\n"
    )
    assert read_properties_file(path) == {
        "security.protocol": "SASL_SSL",
        "sasl.mechanisms": "SCRAM-SHA-512",
        "sasl.jaas.config": 'org.example.Login required username="u";',
        "sasl.password": SECRET,
        "ssl.key.password": "pre-file-secret-post",
    }


@pytest.mark.parametrize(
    ("value", "named"),
    [
        ("${env:AMPS_TEST_SURELY_UNSET}", "environment variable AMPS_TEST_SURELY_UNSET"),
        ("${file:/nonexistent/secret}", "can't read /nonexistent/secret"),
    ],
)
def test_a_missing_secret_is_named_by_key_and_reference(tmp_path, value, named):
    path = tmp_path / "client.properties"
    path.write_text(f"sasl.password={value}\n")
    with pytest.raises(ConfigError) as caught:
        read_properties_file(path)
    assert str(path) in caught.value.reason
    assert "sasl.password" in caught.value.reason
    assert named in caught.value.reason


def test_secret_and_properties_files_past_their_bounds_are_refused(tmp_path):
    """A ${file:} secret is at most MAX_SECRET_FILE_BYTES (64 KiB), a properties file at
    most MAX_PROPERTIES_FILE_BYTES (1 MiB): a large file named by mistake is an error
    naming it, not read into every client."""
    secret = tmp_path / "secret"
    secret.write_bytes(b"s" * (MAX_SECRET_FILE_BYTES + 1))
    path = tmp_path / "client.properties"
    path.write_text(f"sasl.password=${{file:{secret}}}\n")
    with pytest.raises(ConfigError, match=f"sasl.password: {secret} is larger than 65536"):
        read_properties_file(path)
    secret.write_bytes(b"s" * MAX_SECRET_FILE_BYTES)  # at the bound: read
    assert len(read_properties_file(path)["sasl.password"]) == MAX_SECRET_FILE_BYTES
    path.write_bytes(b"#" * (MAX_PROPERTIES_FILE_BYTES + 1))
    with pytest.raises(ConfigError, match="is larger than 1048576 bytes"):
        read_properties_file(path)


def test_a_missing_properties_file_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="can't read the Kafka properties"):
        read_properties_file(tmp_path / "absent.properties")


def test_the_config_section_resolves_and_never_shows_secrets(tmp_path, monkeypatch):
    monkeypatch.setenv("AMPS_TEST_PASSWORD", SECRET)
    path = tmp_path / "config.yaml"
    path.write_text(
        "Kafka:\n"
        "  Properties:\n"
        "    bootstrap.servers: kafka-1:9093\n"
        "    security.protocol: SASL_SSL\n"
        "    enable.ssl.certificate.verification: true\n"
        "    sasl.password: ${env:AMPS_TEST_PASSWORD}\n"
        "    sasl.oauthbearer.client.secret: literal-secret\n"
    )
    config = load_config(path)
    kafka = config.kafka
    assert kafka.bootstrap_servers == "kafka-1:9093"  # bootstrap.servers stands for it
    assert kafka.properties == {
        "security.protocol": "SASL_SSL",
        "enable.ssl.certificate.verification": "true",
        "sasl.password": SECRET,
        "sasl.oauthbearer.client.secret": "literal-secret",
    }
    for shown in (repr(config), str(kafka), str(config.model_dump()), config.model_dump_json()):
        assert SECRET not in shown and "literal-secret" not in shown
        assert REDACTED in shown and "SASL_SSL" in shown


def test_config_errors_quote_no_secret(tmp_path):
    path = tmp_path / "config.yaml"
    path.write_text(
        "Kafka:\n  Properties:\n    sasl.password: literal-secret\n    ssl.ca.location: [a, b]\n"
    )
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    assert "ssl.ca.location" in caught.value.reason
    assert "literal-secret" not in caught.value.reason
    with pytest.raises(ValueError) as raw:  # pydantic's own text quotes no input either
        Config.model_validate(
            {"Kafka": {"Properties": {"sasl.password": "literal-secret", "x": None}}}
        )
    assert "literal-secret" not in str(raw.value)


def test_bootstrap_servers_given_twice_differently_is_an_error():
    with pytest.raises(ValueError, match="give the bootstrap servers once"):
        Config.model_validate(
            {"Kafka": {"BootstrapServers": "a:1", "Properties": {"bootstrap.servers": "b:2"}}}
        )


def test_a_bootstrap_carries_its_properties_but_shows_only_the_address():
    bootstrap = Bootstrap("k:9093", {"sasl.password": SECRET, "client.id": "me"})
    for shown in (repr(bootstrap), str(bootstrap), f"{bootstrap}", f"at {bootstrap!r}"):
        assert SECRET not in shown
    assert bootstrap == "k:9093"
    copy = pickle.loads(pickle.dumps(bootstrap))  # how Spark ships it to its tasks
    assert isinstance(copy, Bootstrap) and dict(copy.properties) == dict(bootstrap.properties)
    config = client_config(bootstrap, **{"client.id": "role"})
    assert config["bootstrap.servers"] == "k:9093"
    assert config["sasl.password"] == SECRET
    assert config["client.id"] == "role"  # what a client sets for its role wins
    merged = with_properties(bootstrap, {"client.id": "config", "ssl.ca.location": "ca.pem"})
    assert merged.properties == {**bootstrap.properties, "ssl.ca.location": "ca.pem"}


_names = st.text(string.ascii_lowercase, min_size=1, max_size=8)
_keys = st.lists(_names, min_size=1, max_size=4).map(".".join)
_values = st.text(
    st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), min_size=1
).filter(lambda v: "${" not in v)


@given(st.dictionaries(_keys, _values, max_size=6), _values)
def test_secrets_never_survive_redaction_or_scrubbing(properties, secret):
    properties = {**properties, "sasl.password": secret}
    assert resolve_all(properties) == properties  # no reference: values pass unchanged
    shown = redacted(properties)
    assert shown["sasl.password"] == REDACTED
    assert all(shown[k] == v for k, v in properties.items() if not is_secret(k))
    quoted = scrub(f"\x00{secret}\x00", {"sasl.password": secret})  # as a library might
    assert quoted == f"\x00{REDACTED}\x00"


def test_secured_properties_naming_no_broker_never_start_the_plain_one(tmp_path, monkeypatch):
    """Without an address anywhere the CLI would start the plain local broker, which a
    SASL_SSL client can't use: it says what is missing instead."""
    from click.testing import CliRunner

    from amps_on_kafka.cli import main

    monkeypatch.delenv("KAFKA_BOOTSTRAP_SERVERS", raising=False)
    path = tmp_path / "client.properties"
    path.write_text("security.protocol=SASL_SSL\nsasl.password=literal-secret\n")
    result = CliRunner().invoke(main, ["topics", "list", "--kafka-config", str(path)])
    assert result.exit_code == 1
    (line,) = result.output.strip().splitlines()
    assert "ask for a secured connection but name no broker" in line
    assert "literal-secret" not in result.output
