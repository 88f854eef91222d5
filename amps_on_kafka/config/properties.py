"""Kafka client properties (librdkafka's names): from the config or a properties file,
secrets resolved from the environment or files, and redacted wherever they are shown.

A value may hold ``${env:NAME}`` (the environment variable NAME) or ``${file:PATH}`` (the
text of a file, without its trailing newline), so a config or properties file can be
committed without the password in it. What counts as a secret is decided by the key
(SECRET_KEY): its value is shown as REDACTED by ``redacted`` and scrubbed from any text
by ``scrub``; errors about a property name the key and the reference, never the value.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path

from jproperties import Properties, PropertyError

from amps_on_kafka.errors import ConfigError

REDACTED = "[redacted]"
# sasl.password, ssl.key.password, ssl.keystore.password, sasl.oauthbearer.client.secret,
# ssl.key.pem (an inline private key), sasl.jaas.config and sasl.oauthbearer.config (which
# may embed credentials).
SECRET_KEY = re.compile(r"password|secret|key\.pem|jaas|oauthbearer\.config", re.IGNORECASE)
_REFERENCE = re.compile(r"\$\{(env|file):([^}]*)\}")
_KEY = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
# A secret file holds a password or a key: a few KiB. Bounded so a reference to a large
# file by mistake is an error, not a config that reads it into every client.
MAX_SECRET_FILE_BYTES = 64 * 1024
# A properties file is a few dozen lines; bounded like the YAML config (config/loader.py).
MAX_PROPERTIES_FILE_BYTES = 1024 * 1024


def is_secret(key: str) -> bool:
    """Whether the value of property `key` must never be shown."""
    return bool(SECRET_KEY.search(key))


def resolve_all(properties: Mapping[object, object]) -> dict[str, str]:
    """Properties as librdkafka takes them: string keys and values, references resolved.

    YAML's scalars are accepted (a boolean is `true`/`false`, a number its digits); a
    list, a mapping or an empty value is a ValueError naming the key.
    """
    out = {}
    for key, value in properties.items():
        if not isinstance(key, str) or not _KEY.fullmatch(key):
            raise ValueError(f"{key!r} is not a Kafka client property name (e.g. sasl.username)")
        out[key] = _resolve(key, _text(key, value))
    return out


def _text(key: str, value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str | int | float) and str(value) != "":
        return str(value)
    raise ValueError(f"property {key} needs a text, number or boolean value")


def _resolve(key: str, value: str) -> str:
    """`value` with each ${env:NAME} and ${file:PATH} replaced."""

    def replace(match: re.Match[str]) -> str:
        kind, name = match.group(1), match.group(2).strip()
        return _from_env(key, name) if kind == "env" else _from_file(key, name)

    return _REFERENCE.sub(replace, value)


def _from_env(key: str, name: str) -> str:
    value = os.environ.get(name)
    if value is None:
        raise ValueError(f"property {key}: environment variable {name} is not set")
    return value


def _from_file(key: str, name: str) -> str:
    path = Path(name).expanduser()
    try:
        return _read_at_most(path, MAX_SECRET_FILE_BYTES).decode("utf-8").rstrip("\r\n")
    except OSError as exc:
        raise ValueError(f"property {key}: can't read {path}: {exc.strerror}") from exc
    except UnicodeDecodeError as exc:
        raise ValueError(f"property {key}: {path} is not UTF-8 text") from exc
    except ValueError as exc:
        raise ValueError(f"property {key}: {exc}") from exc


def _read_at_most(path: Path, limit: int) -> bytes:
    """The bytes of `path`: an OSError as raised, a ValueError past `limit` bytes."""
    with path.open("rb") as file:
        data = file.read(limit + 1)
    if len(data) > limit:
        raise ValueError(f"{path} is larger than {limit} bytes")
    return data


def read_properties_file(path: str | Path) -> dict[str, str]:
    """A Java-style properties file (what Kafka's tools take with --command-config), its
    references resolved. Every problem is a ConfigError naming the file."""
    path = Path(path)
    try:
        data = _read_at_most(path, MAX_PROPERTIES_FILE_BYTES)
    except OSError as exc:
        raise ConfigError(f"{path}: can't read the Kafka properties: {exc.strerror}") from exc
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    parsed = Properties()
    try:
        parsed.load(data, "utf-8")
        return resolve_all({key: value.data for key, value in parsed.items()})
    except (PropertyError, UnicodeDecodeError, ValueError) as exc:
        raise ConfigError(f"{path}: {exc}") from None


def redacted(properties: Mapping[str, str]) -> dict[str, str]:
    """`properties` fit to show: every secret's value replaced by REDACTED."""
    return {key: REDACTED if is_secret(key) else value for key, value in properties.items()}


def scrub(text: str, properties: Mapping[str, str]) -> str:
    """`text` with every secret value of `properties` in it replaced by REDACTED: for a
    message from a library that might quote what it was given."""
    for key, value in properties.items():
        if is_secret(key) and value:
            text = text.replace(value, REDACTED)
    return text
