"""What every section of the configuration model (config/model.py, config/queues.py)
is made of: the strict base model, durations, and Kafka's rule for topic names.
"""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import BaseModel, BeforeValidator, ConfigDict

from amps_on_kafka.config.durations import parse_duration
from amps_on_kafka.expr import compile_filter

# A duration: seconds, or text such as 30s, 5m, 1h (the JSON Schema allows both).
Seconds = Annotated[float, BeforeValidator(parse_duration, json_schema_input_type=float | str)]
TOPIC_NAME = re.compile(r"^[A-Za-z0-9._-]{1,249}$")


def check_topic_name(name: str) -> str:
    """Kafka's own rule for topic names; `|` is excluded, so bookmarks can use it."""
    if not TOPIC_NAME.match(name) or name in (".", ".."):
        raise ValueError(
            f"{name!r} is not a valid Kafka topic name "
            "(1-249 characters of letters, digits, '.', '_' and '-')"
        )
    return name


def check_filter(value: str | None) -> str | None:
    """An optional filter (an entitlement's Read grant, a queue's BarrierExpression)
    compiled at load: FilterError is a ValueError, so the error names the position."""
    if value is not None:
        compile_filter(value)
    return value


class Strict(BaseModel):
    # A section: unknown keys are errors, and a loaded configuration does not change.
    # hide_input_in_errors: a ValidationError's text would quote its input, and a
    # configuration's input may be a password (Kafka.Properties).
    model_config = ConfigDict(
        extra="forbid", frozen=True, populate_by_name=True, hide_input_in_errors=True
    )
