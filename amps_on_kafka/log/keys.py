"""SOW keys: the text that identifies a record, computed from its Key paths.

Like AMPS, key fields are compared as text: `42` and `"42"` name the same record. A
single key is the field's text; a composite key is a JSON array of the fields' texts,
which can't collide with a single key nor be split ambiguously.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import orjson

from amps_on_kafka.errors import MessageError


def split_path(path: str) -> tuple[str, ...]:
    return tuple(part for part in path.split("/") if part)


def field_at(data: Any, parts: Sequence[str]) -> Any:
    """The value at a path, or None where any step is missing."""
    for part in parts:
        if not isinstance(data, dict):
            return None
        data = data.get(part)
    return data


def key_text(value: Any) -> str:
    if type(value) is str:
        return value
    if type(value) is int:
        return str(value)
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return orjson.dumps(value).decode()
    return orjson.dumps(value, option=orjson.OPT_SORT_KEYS).decode()


class KeyExtractor:
    """Computes SOW keys for one topic; built once from its Key paths."""

    def __init__(self, paths: Sequence[str]) -> None:
        self.paths = tuple(paths)
        self._parts = [split_path(p) for p in self.paths]
        only = self._parts[0] if len(self._parts) == 1 else ()
        self._single = only[0] if len(only) == 1 else None

    def __call__(self, data: Any) -> str:
        if self._single is not None:  # the common case: one top-level field
            value = data.get(self._single) if type(data) is dict else None
            if value is None or value == "":
                raise MessageError(f"message has no value for the SOW key field {self.paths[0]}")
            return value if type(value) is str else key_text(value)
        values = []
        for path, parts in zip(self.paths, self._parts, strict=True):
            value = field_at(data, parts)
            if value is None or value == "":
                raise MessageError(f"message has no value for the SOW key field {path}")
            values.append(value)
        return key_from_values(values)


def key_from_values(values: Sequence[Any]) -> str:
    """The SOW key of a record whose key fields hold these values, in Key path order."""
    if len(values) == 1:
        return key_text(values[0])
    return orjson.dumps([key_text(v) for v in values]).decode()
