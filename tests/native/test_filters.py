"""The compiled filter on stored JSON bytes (native/src/filters.rs, made by expr/raw.py)
against the Python filter on the decoded payload (Filter.matches over orjson.loads; a
payload orjson rejects matches nothing).

Over generated filters of the shape (paths of object fields compared with numbers and
texts, under AND, OR and NOT) and generated documents (missing fields, nulls, strings
beside numbers, numeric strings, nested objects, arrays, unicode and escapes, a field
twice, big and odd numbers, broken JSON), where the compiled filter answers it must give
the Python filter's answer; it may be not sure (None), and it must answer the common
cases. The scan's results with and without it: tests/sow/test_stream.py.
"""

from __future__ import annotations

import json
from functools import partial

import orjson
import pytest
from hypothesis import event, example, given, settings
from hypothesis import strategies as st

from amps_on_kafka.expr import Filter, compile_filter
from amps_on_kafka.expr import nodes as n
from amps_on_kafka.expr.raw import plan, raw_check
from amps_on_kafka.native import core
from amps_on_kafka.state.record import HEADER_SIZE
from tests.native.test_staging import ODD, encoded_now_and_then_damaged, nested, scalars

HEADER = bytes(range(HEADER_SIZE))  # the stored record's header: never read as JSON
NAMES = ["qty", "a", "b", "é"]

# -- filters ----------------------------------------------------------------------------
paths = st.lists(st.sampled_from(NAMES), min_size=1, max_size=3).map(
    lambda steps: n.Path(0, tuple(steps))
)
literals = (
    st.integers(-(2**63), 2**64 - 1)
    | st.sampled_from([0, 1, 500, -1, 2**53 + 1, 2**63 - 1, 2**64 - 1, 0.5, 500.0, -0.0, 1e300])
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.sampled_from(["x", "y", "500", "5e2", "-1", ".5", "abc", "é", "🙂", "1e999", "+"])
    | st.text(min_size=1, max_size=3)
).map(lambda value: n.Literal(0, value))
ops = st.sampled_from(["=", "!=", "<", "<=", ">", ">="])


@st.composite
def comparisons(draw) -> n.Node:
    path, literal = draw(paths), draw(literals)
    if draw(st.booleans()):
        return n.Compare(0, draw(ops), literal, path)
    return n.Compare(0, draw(ops), path, literal)


trees = st.recursive(
    comparisons(),
    lambda inner: (
        st.builds(n.Not, st.just(0), inner)
        | st.builds(n.Logical, st.just(0), st.sampled_from(["AND", "OR"]), st.tuples(inner, inner))
    ),
    max_leaves=5,
)

# -- documents --------------------------------------------------------------------------
leaves = (
    scalars
    | st.sampled_from([0, 1, 499, 500, 501, 500.0, 500.5, 2**64, "500", "5e2", "x", "", " 5"])
    | st.sampled_from(["é", "🙂", "y", "-", ".", "1e999", 5e-324, -1e-310, 2.5e-300])
)
values = nested(leaves)
names = st.sampled_from([*NAMES, "q\\u0074y", "Qty", "qty "]) | st.text(max_size=3)
spaces = st.sampled_from(["", " ", "\n\t "])


@st.composite
def objects(draw, depth: int = 0) -> str:
    """An object written member by member, so names may repeat or carry escapes; its
    members are often the filters' fields, nested objects of them at times."""
    dumps = partial(json.dumps, ensure_ascii=draw(st.booleans()))
    members = [
        (dumps(name), dumps(value))
        for name, value in draw(st.lists(st.tuples(names, values), max_size=4))
    ]
    for name in draw(st.lists(st.sampled_from(NAMES), max_size=3)):
        inner = depth < 2 and draw(st.integers(0, 3)) == 0
        value = draw(objects(depth + 1)) if inner else dumps(draw(leaves))
        members.insert(draw(st.integers(0, len(members))), (dumps(name), value))
    s = draw(spaces)
    written = ("," + s).join(f"{name}{s}:{s}{value}" for name, value in members)
    text = "{" + s + written + s + "}"
    return text.replace('"q\\\\u0074y"', '"q\\u0074y"')  # the escaped name "qty"


@st.composite
def documents(draw) -> bytes:
    shape = draw(st.sampled_from(["object"] * 12 + ["odd", "scalar"]))
    if shape == "odd":
        return draw(st.sampled_from(ODD))
    text = json.dumps(draw(values)) if shape == "scalar" else draw(objects())
    return encoded_now_and_then_damaged(draw, text, one_in=8)


def python_answer(filter: Filter, payload: bytes) -> bool:
    """What the scan keeps without the compiled filter (PartitionStore._walk_matching)."""
    try:
        return bool(filter.matches(orjson.loads(payload)))
    except orjson.JSONDecodeError:
        return False


@settings(max_examples=300, deadline=None)
@given(trees, st.lists(documents(), min_size=1, max_size=6))
@example(
    n.Compare(0, ">", n.Path(0, ("qty",)), n.Literal(0, 500)),
    [b'{"qty": 501}', b'{"qty": 500.0000000001}', b'{"qty": "x"}', b'{"qty": true}'],
)
@example(
    n.Compare(0, "=", n.Path(0, ("a", "b")), n.Literal(0, "x")),
    [b'{"a": {"b": "x"}}', b'{"a": {"b": "x", "b": "x"}}', b'{"a": [{"b": "x"}]}', b"[]"],
)
def test_the_compiled_filter_answers_as_the_python_filter(tree: n.Node, payloads: list) -> None:
    filter = Filter("generated", tree)
    shape = plan(tree)
    if shape is None:  # a literal beyond what a plan carries (a big int, 1e999 as a number)
        event("no plan")
        return
    check = raw_check(filter, HEADER_SIZE)
    assert check is not None
    for payload in payloads:
        answer = check(HEADER + payload)
        event(f"compiled answer: {answer}")
        if answer is not None:
            assert answer is python_answer(filter, payload), (filter.tree, payload)


COMMON = [
    ("/qty > 500", b'{"id": 1, "qty": 501, "name": "x"}', True),
    ("/qty > 500", b'{"id": 2, "qty": 12.5, "name": "x"}', False),
    ("/qty > 500", b'{"id": 3, "name": "x"}', False),
    ("/qty > 500", b'{"id": 3, "qty": null}', False),
    ("NOT /qty > 500", b'{"id": 3, "qty": null}', False),
    ("/qty > 500 AND /name = 'x'", b'{"qty": 600, "name": "x", "tags": [1, 2]}', True),
    ("/qty <= 5 OR /name <> 'x'", b'{"qty": 600, "name": "\\u00e9"}', True),
    ("/a/b >= '5'", b'{"a": {"b": 7, "c": {"d": [1]}}}', True),
    ("/a/b = 'x'", b'{"a": 5}', False),
    ("/qty > 500", b"{not json", False),
]


@pytest.mark.parametrize(("text", "payload", "expected"), COMMON)
def test_the_common_cases_are_answered(text: str, payload: bytes, expected: bool) -> None:
    filter = compile_filter(text)
    check = raw_check(filter, HEADER_SIZE)
    assert check is not None
    if payload == b"{not json":
        assert check(HEADER + payload) is None  # orjson decides, and refuses it
        return
    assert check(HEADER + payload) is expected
    assert python_answer(filter, payload) is expected


UNSURE = [
    ("/qty > 500", b'{"qty": [1, 600]}'),  # comparisons lift over arrays
    ("/qty > 500", b'{"qty": 1, "qty": 600}'),  # orjson keeps the last
    ("/qty > 500", b'{"qty": "600"}'),  # a numeric string is its number
    ("/qty = 0.1", b'{"qty": 0.1}'),  # within serde_json's rounding
    ("/qty > 0", b'{"qty": 3e-324}'),  # near zero, an ulp is the whole value
    ("/qty > 500", b"[1]"),  # not an object
    ("/qty > 500", HEADER[:3]),  # shorter than the header
]


@pytest.mark.parametrize(("text", "payload"), UNSURE)
def test_what_could_differ_is_left_to_python(text: str, payload: bytes) -> None:
    check = raw_check(compile_filter(text), HEADER_SIZE)
    assert check is not None
    stored = payload if len(payload) < HEADER_SIZE else HEADER + payload
    assert check(stored) is None


@pytest.mark.parametrize(
    "text",
    [
        "/qty IN (1, 2)",
        "/qty + 1 > 5",
        "/a[0] = 1",
        "/qty = /other",
        "/qty = ''",
        "/flag = true",
        "/qty > 99999999999999999999",
        "/name LIKE 'x'",
        " OR ".join(f"/f{i} = {i}" for i in range(40)),
    ],
)
def test_other_shapes_have_no_plan(text: str) -> None:
    assert plan(compile_filter(text).tree) is None


def test_a_plan_the_core_cannot_take_is_an_error_naming_it() -> None:
    with pytest.raises(ValueError, match="filter plan"):
        core.RawFilter(("cmp", ("a",), "=", True, None), HEADER_SIZE)
    with pytest.raises(ValueError, match="filter plan"):
        core.RawFilter(("xor", ()), HEADER_SIZE)
