"""A queue's section of the configuration (Queues, docs/queues.md): which log topics it
views, where a publish to its name goes, and its delivery rules (semantics, leases,
backlog, fairness, limits, priority, barriers, dead letters). Config (config/model.py)
checks what involves other sections: unique names, dead letters nothing reads again.
"""

from __future__ import annotations

import re
from functools import cached_property
from typing import Literal

from pydantic import Field, field_validator, model_validator

from amps_on_kafka.config.fields import Seconds, Strict, check_filter, check_topic_name
from amps_on_kafka.expr import compile_expression

Semantics = Literal["at-least-once", "at-most-once"]
Fairness = Literal["fast", "round-robin", "proportional"]


class QueueConfig(Strict):
    """A message queue: a view over the log topics its UnderlyingTopic regex matches (seed 001).

    Defaults are this project's (AMPS leaves some to the instance): LeasePeriod 60s,
    MaxPerSubscriptionBacklog 1000, no Expiration, no MaxCancels or MaxDeliveries limit.
    """

    name: str = Field(alias="Name")
    underlying_topic: str | None = Field(None, alias="UnderlyingTopic")
    default_publish_target: str | None = Field(None, alias="DefaultPublishTarget")
    semantics: Semantics = Field("at-least-once", alias="Semantics")
    lease_period: Seconds = Field(60.0, alias="LeasePeriod", gt=0)
    expiration: Seconds | None = Field(None, alias="Expiration", gt=0)
    max_per_subscription_backlog: int = Field(1000, alias="MaxPerSubscriptionBacklog", ge=1)
    delivery_fairness: Fairness | None = Field(None, alias="DeliveryFairness")
    max_cancels: int | None = Field(None, alias="MaxCancels", ge=0)
    max_deliveries: int | None = Field(None, alias="MaxDeliveries", ge=1)
    leasing: Literal["strict", "permissive"] = Field("strict", alias="Leasing")
    priority: str | None = Field(None, alias="Priority")
    barrier_expression: str | None = Field(None, alias="BarrierExpression")
    target_queue_depth: int | None = Field(None, alias="TargetQueueDepth", ge=1)
    dead_letter_topic: str | None = Field(None, alias="DeadLetterTopic")
    # Without it a DeadLetterTopic missing from Kafka stops the worker at startup, as for SOW.
    create_dead_letter_topic: bool = Field(False, alias="CreateDeadLetterTopic")

    _check_name = field_validator("name")(check_topic_name)

    @field_validator("default_publish_target", "dead_letter_topic")
    @classmethod
    def _topic_names(cls, value: str | None) -> str | None:
        return None if value is None else check_topic_name(value)

    @field_validator("underlying_topic")
    @classmethod
    def _regex(cls, value: str | None) -> str | None:
        if value is not None:
            try:
                re.compile(value)
            except re.error as exc:
                raise ValueError(f"{value!r} is not a regular expression: {exc}") from None
        return value

    @field_validator("priority")
    @classmethod
    def _priority(cls, value: str | None) -> str | None:
        if value is not None:
            compile_expression(value)  # FilterError is a ValueError: it names the position
        return value

    _check_barrier = field_validator("barrier_expression")(check_filter)

    @model_validator(mode="after")
    def _consistent(self) -> QueueConfig:
        if self.semantics == "at-most-once" and self.delivery_fairness not in (None, "round-robin"):
            raise ValueError(
                f"DeliveryFairness {self.delivery_fairness!r}: an at-most-once queue supports "
                "only round-robin"
            )
        if self.target_queue_depth is not None:
            for key, value in (
                ("Priority", self.priority),
                ("BarrierExpression", self.barrier_expression),
            ):
                if value is not None:
                    raise ValueError(f"TargetQueueDepth can't be set together with {key}")
        target = self.default_publish_target
        if target is not None and not self.views(target):
            raise ValueError(
                f"DefaultPublishTarget {target!r} does not match {self.underlying}, "
                "so publishes to the queue would never enqueue"
            )
        return self

    @property
    def topic_pattern(self) -> str:
        """UnderlyingTopic, or the queue's own name (matched literally) when there is none."""
        return self.underlying_topic if self.underlying_topic is not None else re.escape(self.name)

    @property
    def underlying(self) -> str:
        """The underlying topics as an error message names them: the pattern as written,
        or the queue's own name (not its escaped pattern) when there is no UnderlyingTopic."""
        if self.underlying_topic is not None:
            return f"UnderlyingTopic {self.underlying_topic!r}"
        return f"the topic {self.name!r} (the queue's name: no UnderlyingTopic is set)"

    @cached_property
    def _pattern(self) -> re.Pattern[str]:
        return re.compile(self.topic_pattern)

    def views(self, topic: str) -> bool:
        """Whether a message published to this log topic is enqueued (the whole name matches)."""
        return self._pattern.fullmatch(topic) is not None

    @property
    def publish_target(self) -> str | None:
        """Where a publish to the queue's name goes; None when the name is an underlying topic.

        A queue named differently from its underlying topics gets `<Name>_DIRECT` by default.
        """
        if self.default_publish_target is not None:
            return self.default_publish_target
        return None if self.views(self.name) else f"{self.name}_DIRECT"

    @property
    def enqueues_publishes_to_its_name(self) -> bool:
        """False for a queue such as WorkToDo over Work: its default `<Name>_DIRECT` is not
        one of its underlying topics, so it takes messages only from those."""
        target = self.publish_target
        return target is None or self.views(target)

    @property
    def fairness(self) -> Fairness:
        if self.delivery_fairness is not None:
            return self.delivery_fairness
        return "proportional" if self.semantics == "at-least-once" else "round-robin"
