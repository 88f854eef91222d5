"""The configuration model, in AMPS vocabulary (Topic, Key, Expiration, MessageType...).

Unknown keys are errors: a misspelt option that silently does nothing is the worst kind
of configuration bug in a messaging system.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, field_validator, model_validator

from amps_on_kafka.config.durations import parse_duration

MessageType = Literal["json", "avro", "binary"]
Seconds = Annotated[float, BeforeValidator(parse_duration)]
_TOPIC_NAME = re.compile(r"^[A-Za-z0-9._-]{1,249}$")


def check_topic_name(name: str) -> str:
    """Kafka's own rule for topic names; `|` is excluded, so bookmarks can use it."""
    if not _TOPIC_NAME.match(name) or name in (".", ".."):
        raise ValueError(
            f"{name!r} is not a valid Kafka topic name "
            "(1-249 characters of letters, digits, '.', '_' and '-')"
        )
    return name


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


class TopicConfig(_Strict):
    """A log topic: one Kafka topic, the transaction log for one logical topic."""

    name: str = Field(alias="Name")
    partitions: int = Field(1, alias="Partitions", ge=1, le=10_000)
    replication_factor: int = Field(1, alias="ReplicationFactor", ge=1)
    message_type: MessageType = Field("json", alias="MessageType")
    schema_path: Path | None = Field(None, alias="Schema")
    retention: Seconds | None = Field(None, alias="Retention")

    _check_name = field_validator("name")(check_topic_name)

    @model_validator(mode="after")
    def _avro_needs_schema(self) -> TopicConfig:
        if self.message_type == "avro" and self.schema_path is None:
            raise ValueError("MessageType avro needs a Schema (path to an .avsc file)")
        return self


class Expiration(_Strict):
    """Seed 000: disabled (default), enabled (per-message only) or a topic default."""

    mode: Literal["disabled", "enabled"]
    default_seconds: float | None = None

    @classmethod
    def parse(cls, value: object) -> Expiration:
        if isinstance(value, Expiration):
            return value
        if value is None or value is False or str(value).lower() == "disabled":
            return cls(mode="disabled")
        if value is True or str(value).lower() == "enabled":
            return cls(mode="enabled")
        return cls(mode="enabled", default_seconds=parse_duration(value))  # type: ignore[arg-type]


class SowConfig(_Strict):
    """A SOW topic: the latest record per key of one log topic."""

    topic: str = Field(alias="Topic")
    key: tuple[str, ...] = Field(alias="Key")
    expiration: Annotated[Expiration, BeforeValidator(Expiration.parse)] = Field(
        default_factory=lambda: Expiration(mode="disabled"), alias="Expiration"
    )
    key_from_publish: bool = Field(False, alias="KeyFromPublish")
    dead_letter_topic: str | None = Field(None, alias="DeadLetterTopic")

    @field_validator("key", mode="before")
    @classmethod
    def _key_paths(cls, value: object) -> tuple[str, ...]:
        paths = (value,) if isinstance(value, str) else tuple(value or ())  # type: ignore[arg-type]
        if not paths:
            raise ValueError("Key needs at least one path such as /id")
        for path in paths:
            if not isinstance(path, str) or not re.fullmatch(r"(/[^/\s]+)+", path):
                raise ValueError(f"Key path {path!r} must look like /field or /a/b")
        return paths


class KafkaConfig(_Strict):
    bootstrap_servers: str | None = Field(None, alias="BootstrapServers")


class GatewayConfig(_Strict):
    listen: str = Field("127.0.0.1:9007", alias="Listen")
    max_frame_bytes: int = Field(4 * 1024 * 1024, alias="MaxFrameBytes", ge=1024)


class Config(_Strict):
    """A whole configuration file."""

    kafka: KafkaConfig = Field(default_factory=KafkaConfig, alias="Kafka")
    topics: tuple[TopicConfig, ...] = Field((), alias="Topics")
    sow: tuple[SowConfig, ...] = Field((), alias="SOW")
    gateway: GatewayConfig = Field(default_factory=GatewayConfig, alias="Gateway")

    @model_validator(mode="after")
    def _sow_topics_are_log_topics(self) -> Config:
        names = [t.name for t in self.topics]
        if len(set(names)) != len(names):
            raise ValueError(f"Topics: a Name appears twice in {names}")
        for sow in self.sow:
            if sow.topic not in names:
                raise ValueError(f"SOW topic {sow.topic!r} is not one of Topics {names}")
        return self

    def topic(self, name: str) -> TopicConfig | None:
        return next((t for t in self.topics if t.name == name), None)

    def sow_for(self, name: str) -> SowConfig | None:
        return next((s for s in self.sow if s.topic == name), None)
