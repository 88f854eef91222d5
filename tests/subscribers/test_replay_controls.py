"""Replay controls on bookmark subscriptions (seed 004): rate, pause/resume, conflation,
durability options, and the CLI's --rate / --conflate."""

from __future__ import annotations

import threading
import time
from dataclasses import replace

import orjson
import pytest
from click.testing import CliRunner
from hypothesis import given
from hypothesis import strategies as st

from amps_on_kafka import NOW
from amps_on_kafka.cli.replay import replay
from amps_on_kafka.client import MemoryBookmarkStore
from amps_on_kafka.log.codecs import JSON
from amps_on_kafka.log.controls import (
    TICK,
    Conflator,
    OptionError,
    Rate,
    parse_options,
    parse_rate,
)
from amps_on_kafka.log.message import COMPLETED, LogMessage
from tests.subscribers.conftest import until_completed

# -- options --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "rate"),
    [
        ("1000", Rate(1000, "messages")),
        ("500KB", Rate(500 * 1024, "bytes")),
        ("2mb", Rate(2 * 1024**2, "bytes")),
        ("2x", Rate(2, "multiple")),
        ("0.5x", Rate(0.5, "multiple")),
    ],
)
def test_rates_are_spelt_as_amps_spells_them(text, rate):
    """Seed 004: messages per second, bytes per second, or a multiple of the original."""
    assert parse_rate(text) == rate


def test_options_combine_and_say_what_is_wrong():
    options = parse_options("rate=2x, pause,conflation=1s,conflation_key=/id")
    assert (options.rate, options.paused) == (Rate(2, "multiple"), True)
    assert (options.conflation, options.conflation_keys) == (1.0, ("/id",))
    assert parse_options("fully_durable").fully_durable
    assert parse_options(None) == parse_options("")
    for bad, complaint in [
        ("rate=fast", "rate 'fast'"),
        ("rate=0", "positive"),
        ("conflation=soon", "conflation interval"),
        ("conflation_key=/id", "needs conflation"),
        ("replay_faster", "unknown or malformed option"),
        ("live,rate=10", "not supported with the live option"),
        ("live,pause", "not supported with the live option"),
    ]:
        with pytest.raises(OptionError, match=complaint):
            parse_options(bad)


OPTION_TEXT = st.lists(
    st.one_of(
        st.sampled_from(["pause", "live", "fully_durable", "oof", "", " "]),
        st.builds(
            "{}={}".format,
            st.sampled_from(["rate", "conflation", "conflation_key", "Rate", "x"]),
            st.one_of(
                st.sampled_from(["10", "2x", "0.5X", "500KB", "1s", "250ms", "/id", "0", "-1"]),
                st.builds(
                    "{:g}{}".format, st.floats(1e-9, 1e9), st.sampled_from(["", "s", "ms", "x"])
                ),
                st.text(max_size=8),
            ),
        ),
        st.text(max_size=12),
    ),
    max_size=6,
).map(",".join)


@given(OPTION_TEXT)
def test_any_option_text_parses_or_is_an_option_error(text):
    """Issue 13: the gateway parses `o` from any client; nothing but OptionError may
    come out of it, and what it accepts it can say again (server_options)."""
    try:
        options = parse_options(text)
    except OptionError as exc:
        assert exc.reason
        return
    assert replace(parse_options(options.server_options()), paused=options.paused) == options


def test_a_gateway_gets_every_option_but_pause():
    assert parse_options("pause,rate=10").server_options() == "rate=10"
    assert parse_options("conflation=500ms,conflation_key=/a,fully_durable").server_options() == (
        "conflation=0.5s,conflation_key=/a,fully_durable"
    )


# -- rate -----------------------------------------------------------------------------


def delivery_span(stream) -> tuple[float, list]:
    """Seconds from the first message to the last before completed, and the messages."""
    messages, first = [], None
    for message in stream:
        if message is COMPLETED:
            return time.monotonic() - first, messages
        first = first or time.monotonic()
        messages.append(message)
    raise AssertionError("no completed marker")


@pytest.mark.timing
def test_rate_in_messages_per_second_holds_within_ten_percent(client, filled):
    """Seed 004: "limits delivery to 1000 messages per second" - here 500 for 2.5 s."""
    topic = filled(1251)
    with client.bookmark_subscribe(topic, "0", options="rate=500") as stream:
        span, messages = delivery_span(stream)
    assert len(messages) == 1251
    assert span == pytest.approx(1250 / 500, rel=0.10)


@pytest.mark.timing
def test_rate_in_bytes_per_second_holds_within_ten_percent(client, topic_factory):
    """Seed 004: "To limit delivery to 500KB per second" - here 100KB for ~2.5 s."""
    topic = topic_factory(1)
    for n in range(250):
        client.publish(topic, {"n": n, "pad": "x" * 1000})
    client.publish_flush(10)
    with client.bookmark_subscribe(topic, "0", options="rate=100KB") as stream:
        span, messages = delivery_span(stream)
    paid = sum(len(m.raw) for m in messages[:-1])  # the last one's bytes are paid after it
    assert span == pytest.approx(paid / (100 * 1024), rel=0.10)


@pytest.mark.timing
def test_rate_as_a_multiple_of_the_original_rate(client, topic_factory):
    """Seed 004: "limit delivery to half the speed at which messages were originally
    published" - paced by the records' LogAppendTime stamps."""
    topic = topic_factory(1)
    for n in range(40):
        client.publish(topic, {"n": n})
        client.publish_flush(10)
        time.sleep(0.03)  # spreads the original publishing over ~1.2 s
    with client.bookmark_subscribe(topic, "0", options="rate=0.5x") as stream:
        span, messages = delivery_span(stream)
    original = (messages[-1].timestamp - messages[0].timestamp) / 1000
    assert original > 1.0
    assert span == pytest.approx(original / 0.5, rel=0.10)


# -- pause and resume -------------------------------------------------------------------


def next_in_background(stream) -> tuple[threading.Event, list]:
    """Ask the stream for its next item from another thread, as a consumer thread would."""
    arrived, box = threading.Event(), []

    def take() -> None:
        box.append(next(stream))
        arrived.set()

    threading.Thread(target=take, daemon=True).start()
    return arrived, box


def test_the_pause_option_creates_a_paused_subscription(client, filled):
    """Seed 004: "An application may create a subscription in the paused state"."""
    topic = filled(5)
    with client.bookmark_subscribe(topic, "0", sub_id="later", options="pause") as stream:
        assert client.bookmark_subscription("later").paused
        arrived, box = next_in_background(stream)
        assert not arrived.wait(0.5)  # paused: nothing comes
        client.resume("later")
        assert arrived.wait(10)
        assert box[0].data["n"] == 0


def test_pause_keeps_the_place_and_resume_continues_from_it(client, filled):
    """Seed 004: "AMPS maintains a record of the current position in the transaction log,
    and begins replay from that point"."""
    topic = filled(20)
    with client.bookmark_subscribe(topic, "0", sub_id="reader") as stream:
        assert [next(stream).data["n"] for _ in range(5)] == list(range(5))
        client.pause(["reader"])
        arrived, box = next_in_background(stream)
        assert not arrived.wait(0.5)
        client.resume(["reader"])
        assert arrived.wait(10)
        rest = until_completed(stream)
    assert [m.data["n"] for m in box + rest] == list(range(5, 20))


def test_a_loop_left_inside_a_batch_goes_on_from_the_next_message(client, filled):
    """Without a bookmark store a replay hands its batches to the subscription whole
    (Replay.ticking(batches=True)): a loop left inside one, a next(), and a loop again
    read every message once, in order, each stamped with the subscription's sub_id."""
    topic = filled(30)
    with client.bookmark_subscribe(topic, "0", sub_id="reader") as stream:
        read = []
        for message in stream:
            read.append(message)
            if len(read) == 3:
                break
        read.append(next(stream))
        read += until_completed(stream)
    assert [m.data["n"] for m in read] == list(range(30))
    assert {m.sub_id for m in read} == {"reader"}


def test_subscriptions_resumed_together_share_one_replay_in_one_order(client, filled):
    """Seed 004: subscriptions paused at the same bookmark, at the same rate, resumed with
    the same command are delivered from the same replay, which preserves order across
    them; one paused elsewhere is resumed on its own."""
    topic = filled(200, partitions=4)
    every = client.bookmark_subscribe(topic, "0", sub_id="every", options="pause")
    some = client.bookmark_subscribe(topic, "0", "/id < 5", sub_id="some", options="pause")
    new = client.bookmark_subscribe(topic, NOW, sub_id="new", options="pause")
    client.resume("every,some,new")
    assert client.bookmark_subscription("every").shared_with == ("every", "some")
    assert client.bookmark_subscription("some").shared_with == ("every", "some")
    assert client.bookmark_subscription("new").shared_with == ()
    everything = [m.bookmark for m in until_completed(every)]
    selected = [m.bookmark for m in until_completed(some)]
    assert len(everything) == 200 and len(selected) == 100
    assert [bookmark for bookmark in everything if bookmark in set(selected)] == selected
    for stream in (every, some, new):
        stream.close()


def test_a_message_of_a_shared_replay_belongs_to_each_subscription(client, filled):
    """Each subscription gets its own message object: its own sub_id, its own discard."""
    topic = filled(10)
    store = MemoryBookmarkStore()
    client.set_bookmark_store(store)
    a = client.bookmark_subscribe(topic, "0", sub_id="a", options="pause")
    b = client.bookmark_subscribe(topic, "0", sub_id="b", options="pause")
    client.resume(["a", "b"])
    first_a, first_b = next(a), next(b)
    assert first_a.bookmark == first_b.bookmark and first_a is not first_b
    assert (first_a.sub_id, first_b.sub_id) == ("a", "b")
    first_b.discard()
    assert (store.get_most_recent("a"), store.get_most_recent("b")) == ("0", first_b.bookmark)
    a.close()
    b.close()


def test_a_subscription_that_read_before_its_pause_resumes_alone(client, filled):
    topic = filled(10)
    a = client.bookmark_subscribe(topic, "0", sub_id="a")
    b = client.bookmark_subscribe(topic, "0", sub_id="b", options="pause")
    assert next(a).data["n"] == 0
    client.pause("a")
    client.resume("a,b")
    assert client.bookmark_subscription("a").shared_with == ()
    assert [m.data["n"] for m in until_completed(a)] == list(range(1, 10))
    assert [m.data["n"] for m in until_completed(b)] == list(range(10))
    a.close()
    b.close()


def test_pausing_an_unknown_subscription_is_an_error(client):
    with pytest.raises(KeyError, match="no open bookmark subscription 'ghost'"):
        client.pause("ghost")


# -- conflation -----------------------------------------------------------------------


def test_conflation_delivers_the_newest_per_key_with_the_first_bookmark(client, topic_factory):
    """Seed 004: the held message is replaced by newer ones with the same conflation_key;
    "the bookmark provided ... is the bookmark for the first conflated message"."""
    topic = topic_factory(1)
    for n in range(30):
        client.publish(topic, {"id": n % 3, "n": n})
    client.publish_flush(10)
    with client.bookmark_subscribe(topic, "0", sub_id="raw") as stream:
        raw = until_completed(stream)
    options = "conflation=5s,conflation_key=/id"
    with client.bookmark_subscribe(topic, "0", options=options) as stream:
        conflated = until_completed(stream)
    assert [m.data for m in conflated] == [{"id": k, "n": 27 + k} for k in range(3)]
    assert [m.bookmark for m in conflated] == [raw[k].bookmark for k in range(3)]
    assert [m.sequence for m in conflated] == [raw[k].sequence for k in range(3)]


def test_conflation_keys_on_the_sow_key_by_default(client, filled):
    topic = filled(40)
    with client.bookmark_subscribe(topic, "0", options="conflation=5s") as stream:
        conflated = until_completed(stream)
    assert sorted(m.data["n"] for m in conflated) == list(range(30, 40))


def test_conflation_releases_a_held_message_when_the_log_goes_quiet(client, topic_factory):
    """Held messages are delivered at the end of the interval, not when the next message
    happens to arrive: live, one burst, then nothing."""
    topic = topic_factory(1)
    options = "conflation=300ms,conflation_key=/id"
    with client.bookmark_subscribe(topic, NOW, options=options, timeout=20) as stream:
        assert next(stream) is COMPLETED
        for n in range(3):
            client.publish(topic, {"id": 1, "n": n})
        client.publish_flush(10)
        published = time.monotonic()
        arrived, box = next_in_background(stream)
        assert arrived.wait(10)
        waited = time.monotonic() - published
    assert box[0].data == {"id": 1, "n": 2} and box[0].offset == 0
    assert 0.2 < waited < 3


# -- durability -----------------------------------------------------------------------


@pytest.mark.parametrize("option", ["live", "fully_durable"])
def test_durability_options_are_accepted_on_kafka(client, filled, option):
    """On kafka:// a consumer reads up to the high watermark: what every in-sync replica
    holds; live (before Kafka acknowledged) is the gateway's (docs/subscribers.md)."""
    topic = filled(3)
    with client.bookmark_subscribe(topic, "0", options=option) as stream:
        assert [m.data["n"] for m in until_completed(stream)] == [0, 1, 2]


# -- the CLI --------------------------------------------------------------------------


def cli_replay(bootstrap: str, *args: str) -> tuple[float, list[dict]]:
    started = time.monotonic()
    result = CliRunner().invoke(replay, [*args, "-b", bootstrap], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    lines = [orjson.loads(line) for line in result.output.splitlines() if line.startswith("{")]
    return time.monotonic() - started, lines


def test_cli_replay_rate_paces_the_output(bootstrap, filled):
    topic = filled(201)
    unpaced, _ = cli_replay(bootstrap, topic)
    paced, lines = cli_replay(bootstrap, topic, "--rate", "100")
    assert len(lines) == 201
    # 200 steps of 10 ms: never sooner (due times advance by exact steps); later only by
    # what a busy machine adds to a whole CLI run, which varies by a second or so here
    assert paced >= 2.0
    assert paced - unpaced < 4.0


def test_cli_replay_conflates_by_a_key(bootstrap, client, topic_factory):
    topic = topic_factory(1)
    for n in range(12):
        client.publish(topic, {"id": n % 4, "n": n})
    client.publish_flush(10)
    _, lines = cli_replay(bootstrap, topic, "--conflate", "5s", "--conflation-key", "/id")
    assert [(line["bookmark"], line["data"]["n"]) for line in lines] == [
        (f"{topic}|0|{k}|", 8 + k) for k in range(4)
    ]


def test_cli_replay_refuses_a_bad_rate(bootstrap, filled):
    topic = filled(1)
    result = CliRunner().invoke(replay, [topic, "--rate", "fast", "-b", bootstrap])
    assert result.exit_code != 0 and "rate 'fast'" in result.output


def test_a_conflator_holds_at_most_max_held_keys():
    """Issue 13, every buffer has a bound: a gateway conflates for any client. With an
    hour's interval and more keys than max_held, the oldest key is delivered early
    (still conflated up to then, with its first bookmark), none lost."""
    keys = [b"a", b"a", b"b", b"c", b"d"]
    messages = [
        LogMessage("t", 0, n, 0, b'{"n": %d}' % n, [("k", key)], JSON) for n, key in enumerate(keys)
    ]
    delivered = list(Conflator(3600, max_held=2).conflated(iter([*messages, COMPLETED])))
    assert [(m.offset, m.data["n"]) for m in delivered[:-1]] == [(0, 1), (2, 2), (3, 3), (4, 4)]
    assert delivered[-1] is COMPLETED

    def three_keys_then_nothing():
        yield from messages[:4]  # keys a, a, b, c
        raise AssertionError("the conflator read on instead of releasing the oldest key")

    early = Conflator(3600, max_held=2).conflated(three_keys_then_nothing())
    assert next(early).offset == 0  # released by the bound, an hour early


def test_a_conflator_passes_ticks_on_while_it_holds_messages():
    """A gateway's replay thread checks for a close only when an item reaches it: a
    conflator that swallowed TICKs while holding a message (an hour's interval here) kept a
    closed subscription's thread, and the gateway's stop, waiting for the next message."""
    held = LogMessage("t", 0, 0, 0, b'{"n": 0}', [("k", b"a")], JSON)
    out = Conflator(3600).conflated(iter([held, TICK, TICK]))
    assert next(out) is TICK
    assert next(out) is TICK
    assert next(out) is held  # released at the end of its source
