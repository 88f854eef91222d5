"""The compiled staging of the SOW apply's blind path (native/src/staging.rs) against its
Python twin (processor/staging.py, blind_records).

Where the compiled code stages a batch it must give exactly what the twin gives (the
same keys, raw keys and records as stored); where the twin declines a batch (a record
that is not a plain publish, a payload orjson rejects, no key), the compiled code must
decline too; and what it declines only because it is not sure (a float or boolean key,
an integer beyond 64 bits, the key field twice, deep nesting) the twin then decides.
"""

from __future__ import annotations

import itertools
import json
import threading
import time
from functools import partial

import orjson
import pytest
from confluent_kafka import Message
from hypothesis import event, example, given, settings
from hypothesis import strategies as st

from amps_on_kafka.config import Config
from amps_on_kafka.log.codecs import JSON
from amps_on_kafka.log.envelope import _STATEFUL, _TEXT, H_SEQUENCE
from amps_on_kafka.processor.staging import blind_records, compiled_stager
from amps_on_kafka.state.sow import SowRules


def rules_keyed_by(field: str) -> SowRules:
    config = Config.model_validate(
        {"Topics": [{"Name": "t", "Partitions": 1}], "SOW": [{"Topic": "t", "Key": f"/{field}"}]}
    )
    return SowRules(config.sow[0], JSON)


FIELDS = ("id", "clé")
RULES = {field: rules_keyed_by(field) for field in FIELDS}

# -- payloads ---------------------------------------------------------------------------
# Written token by token (not by one dumps call) so member names can repeat, carry escapes
# and be spaced oddly, as any producer may write them.
scalars = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.integers(-(2**64), 2**65)
    | st.sampled_from([2**63 - 1, -(2**63), -(2**63) - 1, 2**64 - 1, 2**64, 0])
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(st.characters(exclude_categories=()), max_size=6)
    | st.sampled_from(["", "k", "é", "🙂", "\x00", "\x7f", "\ud800", "a\udc00", "\ud83d\ude42"])
)


def nested(leaves: st.SearchStrategy) -> st.SearchStrategy:
    """JSON values: leaves in lists and objects, a few levels deep."""
    return st.recursive(
        leaves,
        lambda inner: (
            st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3)
        ),
        max_leaves=6,
    )


values = nested(scalars)
names = st.sampled_from([*FIELDS, "v", "Id", "id ", "i\\u0064"]) | st.text(max_size=4)
spaces = st.sampled_from(["", " ", "\n\t ", "\r"])


@st.composite
def payloads(draw, field: str) -> bytes | None:
    """A payload: a JSON object as a producer might write it, perhaps broken or odd, most
    often with `field`."""
    shape = draw(st.sampled_from(["object"] * 10 + ["raw", "raw", "scalar", "none"]))
    if shape == "none":
        return None
    if shape == "raw":
        return draw(st.sampled_from(ODD))
    ascii_only = draw(st.booleans())
    if shape == "scalar":
        text = json.dumps(draw(values), ensure_ascii=ascii_only)
    else:
        members = draw(st.lists(st.tuples(names, values), max_size=4))
        if draw(st.sampled_from([True, True, True, False])):  # mostly, the key field
            key = draw(st.integers() | st.text(min_size=1) | scalars)
            members.insert(draw(st.integers(0, len(members))), (field, key))
        s = draw(spaces)
        dumps = partial(json.dumps, ensure_ascii=ascii_only)
        text = "{" + s + ("," + s).join(f"{dumps(n)}{s}:{s}{dumps(v)}" for n, v in members)
        text = text + s + "}"
        text = text.replace('"i\\\\u0064"', '"i\\u0064"')  # the escaped name "id"
    return encoded_now_and_then_damaged(draw, text, one_in=6)


def encoded_now_and_then_damaged(draw, text: str, one_in: int) -> bytes:
    """`text` as UTF-8 (a lone surrogate stays: invalid UTF-8), and in about one draw of
    `one_in` with a byte replaced by up to two others (broken JSON, cut characters)."""
    raw = text.encode("utf-8", "surrogatepass")
    edit = draw(st.none() | st.tuples(st.integers(0, len(raw)), st.binary(max_size=2)))
    if edit is not None and draw(st.sampled_from([False] * (one_in - 1) + [True])):
        at, new = edit
        raw = raw[:at] + new + raw[at + 1 :]
    return raw


ODD = [
    b'{"id": 1e400}',
    b'{"id": 1, "v": 1e400}',
    b'{"id": 1, "v": 1.7976931348623158e308}',
    b'{"id": 1, "v": 1.7976931348623159e308}',
    b'{"id": 1, "v": -%d}' % (2**1024 - 2**970),  # the integer just past the largest float
    b'{"id": -0}',
    b'{"id": 1, "v": [0e400, 1e-99999, 0e99999999999999999999, 10e307, 0.1e309]}',
    b'{"id": 1, "v": 1e0309}',
    b'{"id": 1, "v": 1e99999999999999999999}',
    b'{"id": 18446744073709551616}',
    b'{"id": -9223372036854775809}',
    b'{"id": "\\ud800"}',
    b'{"id": "a", "v": "\\udc00"}',
    b'{"id": "a", "\\ud83d\\ude42": 1}',
    b'\xef\xbb\xbf{"id": 1}',
    b'{"id": 1}\x00',
    b'{"id": 1,}',
    b'{"id": "\x01"}',
    b'{"id": 1, "id": 2}',
    b'{"id": 1, "v": ' + b"[" * 200 + b"]" * 200 + b"}",
    b'{"id": 1, "v": ' + b"[" * 1100 + b"]" * 1100 + b"}",
    b'{"id": 1, "v": NaN}',
    b'{"i\\u0064": "x"}',
    b"",
    b"  ",
]

# -- headers ----------------------------------------------------------------------------
header_names = st.sampled_from(sorted(_STATEFUL | _TEXT | {H_SEQUENCE, "zz", "é"}))
header_values = st.none() | st.sampled_from([b"", b"12", b"1x", b"pub", "é".encode(), b"\xff"])
usual_headers = st.sampled_from([None, [], [("p", b"pub"), ("s", b"12"), ("k", b"k")]])
headers = st.one_of(
    *[usual_headers] * 5, st.lists(st.tuples(header_names, header_values), max_size=3)
)


@st.composite
def batches(draw, payload: st.SearchStrategy) -> list[Message]:
    count = draw(st.integers(1, 3))
    return [
        Message(
            topic="t",
            partition=0,
            offset=draw(st.integers(0, 2**62)),
            value=draw(payload),
            headers=draw(headers),
            timestamp=(draw(st.sampled_from([0, 1, 2])), draw(st.integers(-1, 2**45))),
        )
        for _ in range(count)
    ]


def record(payload: bytes, headers: list | None = None) -> Message:
    return Message(topic="t", value=payload, headers=headers, offset=3, timestamp=(1, 9))


def staged_both_ways(field: str, records: list[Message]):
    rules = RULES[field]
    read = [record.headers() for record in records]
    stager = compiled_stager(rules)
    assert stager is not None
    return stager(records, read), blind_records(rules, records, read)


@settings(max_examples=600, deadline=None)
@given(
    st.sampled_from(FIELDS).flatmap(
        lambda field: st.tuples(st.just(field), batches(payloads(field)))
    )
)
@example(("id", [record(b'{"id": 7, "v": [1, {"a": null}]}')]))
@example(("id", [record(b'{"id": 7}', [("s", b"")])]))  # an empty sequence: not a number
# past the midpoint between the largest float and 2**1024: infinite, which orjson rejects,
# but serde_json's (faster, not exactly rounded) parse reads the largest float
@example(("id", [record(b'{"id": 7, "v": 1.79769313486231585e308}')]))
@example(("id", [record(b'{"id": 7}', [("p", b"\xc3\xa9")])]))  # text, but not ASCII
def test_the_compiled_staging_gives_what_the_twin_gives_or_leaves_it_the_batch(case):
    field, records = case
    compiled, twin = staged_both_ways(field, records)
    event(
        "declined by both"
        if twin is None
        else "staged by the twin only"
        if compiled is None
        else "staged compiled"
    )
    if twin is None:
        assert compiled is None
    elif compiled is not None:
        assert compiled == twin


plain_values = nested(st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.text())
plain = st.fixed_dictionaries(
    {"id": st.integers(-(2**63), 2**64 - 1) | st.text(min_size=1), "v": plain_values}
).map(orjson.dumps)


# headers a plain publish may carry, among them names that only look like the envelope's
plain_headers = st.lists(
    st.sampled_from(
        [("p", b"pub"), ("s", b"12"), ("k", b""), ("zz", b"\xff"), ("c\x00", b"x"), ("ks ", b"1")]
    ),
    max_size=4,
)


@settings(max_examples=200, deadline=None)
@given(batches(payload=plain), st.lists(plain_headers, min_size=3, max_size=3))
def test_plain_publishes_with_a_text_or_integer_key_are_staged_compiled(records, headers):
    for record, its_headers in zip(records, headers, strict=False):
        record.set_headers(its_headers)
    compiled, twin = staged_both_ways("id", records)
    assert compiled is not None
    assert compiled == twin


@pytest.mark.parametrize(
    "payload",
    [
        b'{"id": 1.0}',
        b'{"id": true}',
        b'{"id": 18446744073709551616}',
        b'{"id": -0}',
        b'{"id": 1, "id": 2}',
        b'{"id": 1, "v": ' + b"[" * 200 + b"]" * 200 + b"}",
    ],
)
def test_what_the_compiled_code_is_not_sure_of_the_twin_stages(payload):
    compiled, twin = staged_both_ways("id", [record(payload)])
    assert compiled is None
    assert twin is not None
    assert twin[1] == [RULES["id"].keys(orjson.loads(payload))]


@pytest.mark.timing
def test_a_batch_of_large_records_lets_another_thread_run():
    """48 MB of JSON staged in one call (40-60 ms): another Python thread still runs in
    it, as it does between the twin's bytecodes, so the gateway's event loop in the same
    process is not held up for the whole batch."""
    payload = orjson.dumps({"id": 1, "v": ["x" * 1000] * 1000})
    records = [record(payload) for _ in range(48)]
    stager = compiled_stager(RULES["id"])
    ticks: list[float] = []
    started, done = threading.Event(), threading.Event()

    def tick() -> None:
        started.set()
        while not done.is_set():
            ticks.append(time.perf_counter())

    ticker = threading.Thread(target=tick)
    ticker.start()
    started.wait()
    begun = time.perf_counter()
    staged = stager(records, [None] * len(records))
    ended = time.perf_counter()
    done.set()
    ticker.join()
    assert staged is not None
    pauses = [b - a for a, b in itertools.pairwise(ticks) if b > begun and a < ended]
    assert max(pauses) < (ended - begun) / 2  # without the hand-over: the whole call
