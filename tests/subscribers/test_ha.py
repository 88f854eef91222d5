"""HAClient: reconnect with a chooser and backoff, resubscribe, republish (seed 003)."""

from __future__ import annotations

import time

import pytest

from amps_on_kafka.client import (
    Backoff,
    HAClient,
    MemoryBookmarkStore,
    MemoryPublishStore,
    RoundRobinChooser,
)
from amps_on_kafka.client.publish_store import StoredPublish
from amps_on_kafka.errors import MessageError, TransportError
from amps_on_kafka.log.message import COMPLETED
from tests.subscribers.conftest import until_completed

DEAD = "kafka://127.0.0.1:1"  # nothing listens on port 1
QUICK = Backoff(initial=0.05, maximum=0.2, give_up_after=20)


def ha_client(bootstrap: str, name: str, uris: list[str] | None = None, **kw) -> HAClient:
    uris = uris or [f"kafka://{bootstrap}", f"kafka://localhost:{bootstrap.rsplit(':', 1)[1]}"]
    return HAClient(name, uris, backoff=QUICK, logon_timeout=1.0, **kw)


def test_round_robin_chooser_moves_to_the_next_uri_on_failure():
    chooser = RoundRobinChooser(["a", "b", "c"])
    assert chooser.current() == "a"
    chooser.report_success("a")
    assert chooser.current() == "a"
    chooser.report_failure("a", OSError("refused"))
    chooser.report_failure("b", None)
    assert chooser.current() == "c"
    chooser.report_failure("c", None)
    assert chooser.current() == "a"
    assert chooser.failures[0] == ("a", "refused")
    with pytest.raises(TransportError, match="needs a server: pass URIs or call connect"):
        RoundRobinChooser([]).current()  # HAClient(name) then connect(uri), as a Client


def test_a_malformed_uri_is_refused_at_once_rather_than_retried_forever():
    """An HA client given http://x logged a warning and retried it without end."""
    with pytest.raises(TransportError, match="unknown scheme 'http'"):
        HAClient("ha-bad-uri", ["http://x"])
    with HAClient("ha-bad-uri-2") as ha, pytest.raises(TransportError, match="needs host:port"):
        ha.connect("kafka://")


def test_backoff_grows_exponentially_up_to_its_bound():
    delays = Backoff(initial=0.1, maximum=1.0, factor=3.0).delays()
    assert [round(next(delays), 3) for _ in range(5)] == [0.1, 0.3, 0.9, 1.0, 1.0]


def test_connect_fails_over_to_the_next_uri(bootstrap):
    with ha_client(bootstrap, "ha-failover", [DEAD, f"kafka://{bootstrap}"]) as ha:
        ha.connect_and_logon()
        assert ha.chooser.current() == f"kafka://{bootstrap}"
        assert [uri for uri, _ in ha.chooser.failures] == [DEAD]


def test_connect_gives_up_after_the_configured_time(caplog):
    backoff = Backoff(initial=0.05, maximum=0.1, give_up_after=1.5)
    with HAClient("ha-give-up", [DEAD], backoff=backoff, logon_timeout=0.3) as ha:
        started = time.monotonic()
        with pytest.raises(TransportError, match=r"no server answered in 1\.5s"):
            ha.connect_and_logon()
        assert time.monotonic() - started < 5
        assert len(ha.chooser.failures) >= 2  # it retried before giving up
    # each retry is logged: by default an HA client never gives up, and a wrong URI
    # would otherwise be a silent hang
    retries = [r for r in caplog.records if r.name == "amps_on_kafka.client.ha"]
    assert retries and all(r.levelname == "WARNING" for r in retries)
    assert f"'ha-give-up': {DEAD}: " in retries[0].getMessage()
    assert "next try in 0.05 s" in retries[0].getMessage()


def test_a_reconnect_resubscribes_from_the_recovery_point_with_no_loss_or_duplicate(
    bootstrap, client, filled
):
    """Seed 003: the HAClient reissues the subscription on reconnect, with the bookmark
    at which it should resume (here: the bookmark store's recovery point)."""
    topic = filled(20, partitions=2)
    with ha_client(bootstrap, "ha-resubscribe", bookmark_store=MemoryBookmarkStore()) as ha:
        got = []
        with ha.bookmark_subscribe(topic, "0", sub_id="follow") as stream:
            for message in stream:
                if message is COMPLETED:
                    continue
                got.append(message.data["n"])
                if len(got) < 8:
                    message.discard()  # 8 and 9 stay with the application, undiscarded
                if len(got) == 10:
                    generation = ha.generation
                    ha.reconnect()
                    assert ha.generation == generation + 1
                    for n in range(20, 25):
                        client.publish(topic, {"id": n % 10, "n": n})
                    client.publish_flush(10)
                if len(got) == 25:
                    break
        assert sorted(got) == list(range(25))
        assert [uri for uri, _ in ha.chooser.failures] == [f"kafka://{bootstrap}"]


def test_a_reconnect_republishes_what_kafka_never_acknowledged(bootstrap, client, topic_factory):
    """Publishes in the publish store go out again with their original sequence; the
    copies that had reached Kafka are duplicates the subscriber's store drops."""
    topic = topic_factory(1)
    store = MemoryPublishStore()
    with ha_client(bootstrap, "ha-republish", publish_store=store, flush_every=None) as ha:
        sequences = [ha.publish(topic, {"n": n}) for n in range(10)]
        assert sequences == sorted(sequences) and len(store) == 10
        ha.reconnect()  # the old connection flushed them; the store never heard it
        ha.publish_flush(10)
        assert len(store) == 0
    with client.bookmark_subscribe(topic, "0", sub_id="raw") as stream:
        raw = until_completed(stream)
    assert [m.sequence for m in raw] == sequences * 2
    client.set_bookmark_store(MemoryBookmarkStore())
    with client.bookmark_subscribe(topic, "0", sub_id="deduped") as stream:
        assert [m.data["n"] for m in until_completed(stream)] == list(range(10))


def test_flush_every_keeps_the_publish_store_small(bootstrap, topic_factory):
    topic = topic_factory(1)
    store = MemoryPublishStore()
    with ha_client(bootstrap, "ha-flush-every", publish_store=store, flush_every=5) as ha:
        for n in range(12):
            ha.publish(topic, {"n": n})
        assert len(store) == 2  # flushed after the 5th and the 10th


def test_sow_delete_goes_through_the_publish_store(bootstrap, client, topic_factory):
    topic = topic_factory(1, key=("/id",))
    store = MemoryPublishStore()
    with ha_client(bootstrap, "ha-delete", publish_store=store, flush_every=None) as ha:
        ha.publish(topic, {"id": 1})
        first = ha.sow_delete(topic, keys=["1"]).sequence
        after = ha.publish(topic, {"id": 2})
        assert [e.command for e in store.unpersisted()] == ["publish", "sow_delete", "publish"]
        ha.publish_flush(10)
        assert len(store) == 0
    with client.bookmark_subscribe(topic, "0") as stream:
        records = until_completed(stream)
    assert [(m.command, m.sequence) for m in records[1:]] == [
        ("sow_delete", first),
        ("publish", after),
    ]
    assert after > first


def test_a_command_refused_before_it_is_sent_leaves_no_entry_to_republish(bootstrap, topic_factory):
    """A refused sow_delete or payload stayed in the publish store, and every reconnect
    then raised its error again: the HA client could no longer connect."""
    topic = topic_factory(1, key=("/id",))
    store = MemoryPublishStore()
    with ha_client(bootstrap, "ha-refused", publish_store=store, flush_every=None) as ha:
        with pytest.raises(MessageError, match="exactly one of filter, keys or data"):
            ha.sow_delete(topic)
        with pytest.raises(MessageError, match="a list of keys, not a string"):
            ha.sow_delete(topic, keys="12")
        with pytest.raises(MessageError, match="payload is not valid JSON"):
            ha.publish(topic, "{not json")
        assert len(store) == 0
        ha.reconnect()
        assert ha.generation == 2


def test_a_restarted_publisher_numbers_after_what_its_store_holds(bootstrap, topic_factory):
    """Sequences must keep rising across restarts, past anything still to republish."""
    topic = topic_factory(1)
    store = MemoryPublishStore()
    later = time.time_ns() // 1000 + 10**12  # a stored number from "later" than the clock
    store.store(StoredPublish(later, "publish", topic, {"n": "stored"}))
    with ha_client(bootstrap, "ha-numbers", publish_store=store) as ha:
        assert ha.publish(topic, {"n": "new"}) == later + 1


def test_pause_and_resume_through_the_ha_client(bootstrap, filled):
    topic = filled(5)
    with ha_client(bootstrap, "ha-pause") as ha:
        stream = ha.bookmark_subscribe(topic, "0", sub_id="p", options="pause")
        assert ha.client.bookmark_subscription("p").paused
        ha.resume("p")
        assert [m.data["n"] for m in until_completed(stream)] == list(range(5))
        ha.pause(["p"])
        assert ha.client.bookmark_subscription("p").paused
        stream.close()


def test_failed_connects_never_show_the_uri_password(caplog):
    uri = "tcp://user:s3cret@127.0.0.1:1/amps/json"
    backoff = Backoff(initial=0.05, maximum=0.05, give_up_after=0.3)
    ha = HAClient("ha-secret", [uri], backoff=backoff, logon_timeout=0.3)
    with ha, pytest.raises(TransportError, match=r"user:\*\*\*@") as caught:
        ha.connect_and_logon()
    assert "s3cret" not in str(caught.value)
    logged = [r.getMessage() for r in caplog.records if r.name == "amps_on_kafka.client.ha"]
    assert logged and not any("s3cret" in line for line in logged)
