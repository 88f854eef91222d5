"""A replay's topic pattern comes from any client of a gateway: it runs on RE2 (linear
time), and a pattern RE2 refuses is an UnknownTopic that names it."""

from __future__ import annotations

import time

import pytest
from confluent_kafka.admin import AdminClient

from amps_on_kafka.errors import UnknownTopic
from amps_on_kafka.log.replay import select_topics


@pytest.fixture
def admin(bootstrap: str) -> AdminClient:
    return AdminClient({"bootstrap.servers": bootstrap})


def test_a_catastrophic_topic_pattern_answers_at_once(admin, topic_factory) -> None:
    name = topic_factory(name="a" * 60 + f"-{time.time_ns()}")
    started = time.perf_counter()
    with pytest.raises(UnknownTopic, match="no topic matches"):
        select_topics(admin, "(a+)+$")  # no topic is only a's: Python's re never returned
    assert time.perf_counter() - started < 5.0
    assert select_topics(admin, "(a+)+-[0-9]+") == [name]


@pytest.mark.parametrize("pattern", [r"(a)\1.*", "x(?=y).*", "a)|(b"])
def test_a_topic_pattern_re2_refuses_names_itself(admin, pattern: str) -> None:
    with pytest.raises(UnknownTopic, match="is not a valid regular expression"):
        select_topics(admin, pattern)
