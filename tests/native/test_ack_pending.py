"""The acks `message.ack()` batches, compiled (native/src/batches.rs, AckPending) against
the twin (client/acks.py, PendingAcks): the same answers to the same calls.

Sequences of calls as a connection makes them (acks of messages with and without a
bookmark, topic or lease; options good, bad and of other types; topics and options that
are equal but not the same object, which the compiled batch's shortcut for the last list
must not tell apart; takes, the timer's looks with a batch due at once or not for a long
while, a batch size changed, a close), each answered alike: what is returned, the error
raised, and the count pending.
"""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from amps_on_kafka.client.acks import PendingAcks
from amps_on_kafka.native import core

LONG = 1e9  # a timeout no batch reaches in a test


def fresh(text: str) -> str:
    """An equal text that is another object."""
    return "".join(list(text))


topics = st.sampled_from(["q", "r"]).map(fresh) | st.sampled_from(["q", None])
options = st.sampled_from([None, "cancel", "expire", "bogus", 3, b"cancel"]) | st.just(
    "cancel"
).map(fresh)
metas = st.fixed_dictionaries(
    {},
    optional={
        "bm": st.sampled_from(["q|0|1|", "q|0|2|", None, 7]),
        "lp": st.sampled_from([60_000, 0, None]),
        "n": st.just(2),
    },
)
calls = st.lists(
    st.one_of(
        st.tuples(st.just("add"), topics, metas, options),
        st.tuples(st.just("take")),
        st.tuples(st.just("due"), st.sampled_from([0.0, LONG])),
        st.tuples(st.just("batch_size"), st.integers(1, 4)),
        st.tuples(st.just("close")),
    ),
    max_size=30,
)


def answer(pending: Any, call: tuple) -> Any:
    """What `pending` answers to `call`: its value (a due's seconds only as their kind:
    the two clocks are read apart) or its error, and the count left."""
    name, *args = call
    try:
        if name == "batch_size":
            pending.batch_size = args[0]
            got: Any = None
        else:
            got = getattr(pending, name)(*args)
    except Exception as exc:
        got = f"{type(exc).__name__}: {exc}"
    if type(got) is float:
        got = "until a batch begins" if got == -1.0 else ("sleep", LONG - 1 < got <= LONG)
    return got, pending.count


@settings(max_examples=500, deadline=None)
@given(st.integers(1, 4), calls)
def test_the_compiled_batch_answers_as_its_twin(batch_size: int, sequence: list[tuple]) -> None:
    compiled, twin = core.AckPending(batch_size), PendingAcks(batch_size)  # type: ignore[union-attr]
    for call in sequence:
        assert answer(compiled, call) == answer(twin, call), call
    assert compiled.batch_size == twin.batch_size


def test_a_bursts_acks_fill_one_list_and_a_batch_wakes_a_sleeping_timer_once() -> None:
    """The last list's shortcut: equal topics that are other objects join the same list;
    a new option starts one of its own."""
    pending = core.AckPending(5)  # type: ignore[union-attr]
    assert pending.due(LONG) == -1.0  # nothing waits: the timer sleeps until a batch begins
    lease = {"lp": 1}
    assert pending.add("q", {"bm": "q|0|1|", **lease}, None) is True  # wake it
    assert pending.add(fresh("q"), {"bm": "q|0|2|", **lease}, None) is None
    assert pending.add("q", {"bm": "q|0|3|", **lease}, "cancel") is None
    assert pending.add("q", {"bm": "q|0|4|", **lease}, None) is None
    assert pending.add("q", {"bm": "q|0|5|", **lease}, None) == {
        ("q", None): ["q|0|1|", "q|0|2|", "q|0|4|", "q|0|5|"],
        ("q", "cancel"): ["q|0|3|"],
    }
    assert pending.add("q", {"bm": "q|0|6|", **lease}, None) is None  # the timer is awake
    assert pending.due(0.0) == {("q", None): ["q|0|6|"]}
    pending.close()
    assert pending.due(0.0) is None
