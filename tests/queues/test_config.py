"""Queue configuration (seeds 001 and 002): AMPS keys, defaults, and errors that name the
offending key."""

from __future__ import annotations

from pathlib import Path

import pytest

from amps_on_kafka.config import Config, QueueConfig, load_config
from amps_on_kafka.errors import ConfigError

EXAMPLE = Path(__file__).parents[2] / "config" / "queues-example.yaml"


def load(tmp_path: Path, queues: str) -> object:
    path = tmp_path / "amps.yaml"
    path.write_text("Topics:\n  - Name: work\nQueues:\n" + queues)
    return load_config(path)


def test_defaults():
    queue = QueueConfig(Name="work")
    assert queue.semantics == "at-least-once"
    assert queue.fairness == "proportional"
    assert queue.leasing == "strict"
    assert queue.topic_pattern == "work"
    assert queue.views("work") and not queue.views("work2")
    assert queue.publish_target is None  # the name is its own underlying topic


def test_errors_name_a_queues_topics_as_the_config_gave_them():
    """Without UnderlyingTopic the pattern is the escaped name: an error quoted it as
    'a16\\\\-q' (escaped, then repr'd) for a queue named a16-q."""
    assert QueueConfig(Name="a16-q.x").underlying == (
        "the topic 'a16-q.x' (the queue's name: no UnderlyingTopic is set)"
    )
    assert QueueConfig(Name="q", UnderlyingTopic="orders-.*").underlying == (
        "UnderlyingTopic 'orders-.*'"
    )


def test_durations_are_amps_durations(tmp_path):
    config = load(tmp_path, "  - Name: work\n    LeasePeriod: 500ms\n    Expiration: 2h\n")
    queue = config.queue("work")
    assert (queue.lease_period, queue.expiration) == (0.5, 7200)


def test_default_publish_target_is_name_direct_when_the_name_is_not_an_underlying_topic():
    queue = QueueConfig(Name="JOBS", UnderlyingTopic="^JOBS_(IN|DIRECT)$")
    assert queue.publish_target == "JOBS_DIRECT"


def test_a_queue_named_differently_from_its_topic_needs_no_DIRECT_topic():
    """AMPS's own first example: the queue WorkToDo over the topic Work."""
    config = Config.model_validate({"Queues": [{"Name": "WorkToDo", "UnderlyingTopic": "Work"}]})
    queue = config.queue("WorkToDo")
    assert queue.views("Work") and not queue.views("WorkToDo")
    assert queue.publish_target == "WorkToDo_DIRECT"
    assert config.publish_target("Work") == "Work"
    with pytest.raises(ConfigError, match="DefaultPublishTarget 'WorkToDo_DIRECT' does not match"):
        config.publish_target("WorkToDo")  # it would never reach the queue


def test_several_queues_may_view_the_same_topic():
    config = load_config(EXAMPLE)
    assert [q.name for q in config.queues_viewing("ORDERS")] == ["ORDERS_ANALYTICS", "ORDERS_RISK"]


@pytest.mark.parametrize(
    ("queue", "named"),
    [
        ("    Semantics: at-most-once\n    DeliveryFairness: proportional\n", "DeliveryFairness"),
        ("    Semantics: at-most-once\n    DeliveryFairness: fast\n", "only round-robin"),
        ("    Semantics: sometimes\n", "Queues[0].Semantics"),
        ("    DeliveryFairness: random\n", "Queues[0].DeliveryFairness"),
        ("    TargetQueueDepth: 10\n    Priority: /p\n", "TargetQueueDepth"),
        ("    TargetQueueDepth: 10\n    BarrierExpression: /b = 1\n", "BarrierExpression"),
        ("    UnderlyingTopic: 'work('\n", "Queues[0].UnderlyingTopic"),
        ("    Priority: /p +\n", "Queues[0].Priority"),
        ("    BarrierExpression: /b = = 1\n", "Queues[0].BarrierExpression"),
        ("    UnderlyingTopic: ^in$\n    DefaultPublishTarget: out\n", "DefaultPublishTarget"),
        ("    Leasing: lenient\n", "Queues[0].Leasing"),
        ("    LeasePeriod: soon\n", "Queues[0].LeasePeriod"),
        ("    MaxPerSubscriptionBacklog: 0\n", "Queues[0].MaxPerSubscriptionBacklog"),
        ("    MaxDeliverys: 3\n", "Queues[0].MaxDeliverys"),
        ("    DeadLetterTopic: 'a|b'\n", "Queues[0].DeadLetterTopic"),
    ],
)
def test_errors_name_the_offending_key(tmp_path, queue, named):
    with pytest.raises(ConfigError) as caught:
        load(tmp_path, "  - Name: work\n" + queue)
    assert named in str(caught.value)
    assert "amps.yaml" in str(caught.value)


def test_a_queue_name_appears_once(tmp_path):
    with pytest.raises(ConfigError, match="Name appears twice"):
        load(tmp_path, "  - Name: work\n  - Name: work\n")
