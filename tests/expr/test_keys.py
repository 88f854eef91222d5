"""expr/keys.py: a `/path = literal` filter built without the parser is the parser's.

The tree built from the match must equal the parser's tree, positions included: the
Filter compiled from it is then the same code with the same key equalities. Texts are
generated near the shape (names, spaces, numbers, quotes, backslashes, control
characters, unicode), so both the texts it takes and the ones it must leave to the
parser are exercised.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from amps_on_kafka.expr import FilterError, compile_filter
from amps_on_kafka.expr.keys import KeyEquality, compile_key_filter, key_equality
from amps_on_kafka.expr.parser import parse
from amps_on_kafka.log.keys import key_from_values

NAMES = st.sampled_from(["id", "a", "_x", "Key9", "AND", "null", "9a", "é", "a-b", ""])
SPACES = st.sampled_from(["", " ", "  ", "\t", "\n", "\u00a0"])
NUMBERS = st.one_of(
    st.integers(-(10**19), 10**19).map(str),
    st.sampled_from(["007", "-0", "1.5", "1e3", "- 1", "+1", "0x1"]),
)
TEXTS = st.lists(st.sampled_from(["a", " ", "'", "''", "\\", "\n", "\x7f", "é", "%"])).map("".join)
LITERALS = st.one_of(NUMBERS, TEXTS.map(lambda t: f"'{t}'"), st.sampled_from(["NULL", "''"]))


@st.composite
def near_key_filters(draw: st.DrawFn) -> str:
    path = "".join(f"/{draw(NAMES)}" for _ in range(draw(st.integers(1, 3))))
    parts = [draw(SPACES), path, draw(SPACES), draw(st.sampled_from(["=", "==", "!="]))]
    return "".join([*parts, draw(SPACES), draw(LITERALS), draw(SPACES)])


@settings(max_examples=2000, deadline=None)
@given(near_key_filters())
def test_a_key_filter_built_without_the_parser_is_the_parsers(text: str) -> None:
    tree = key_equality(text)
    if tree is None:
        return
    assert tree == parse(text)
    built, compiled = compile_key_filter(text), compile_filter(text)
    assert built is not None
    assert built.equalities(["/" + "/".join(tree.left.steps)]) == compiled.equalities(  # type: ignore[attr-defined]
        ["/" + "/".join(tree.left.steps)]  # type: ignore[attr-defined]
    )


@settings(max_examples=500, deadline=None)
@given(st.text(max_size=40))
def test_any_text_it_takes_parses_to_the_same_tree(text: str) -> None:
    tree = key_equality(text)
    if tree is not None:
        assert tree == parse(text)


FIELD_VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(),
    st.text(max_size=3),
    st.lists(st.integers(-3, 3), max_size=3),
    st.dictionaries(st.sampled_from(["id", "b"]), st.integers(-3, 3), max_size=2),
)


@st.composite
def key_filters_and_records(draw: st.DrawFn) -> tuple[str, dict]:
    """A `/path = literal` text and a record whose field is near or at the literal."""
    path = draw(st.sampled_from(["/id", "/a/b", "/_x9"]))
    number = draw(st.integers(-(10**18) + 1, 10**18 - 1))
    word = draw(st.sampled_from(["x y", "42", "-7", "true", "null", "%"]))
    literal = draw(st.sampled_from([str(number), f"'{word}'"]))
    value = draw(
        st.one_of(FIELD_VALUES, st.sampled_from([number, float(number), str(number), word]))
    )
    steps = path[1:].split("/")
    record: dict = {steps[-1]: value}
    for step in reversed(steps[:-1]):
        record = {step: record}
    return f"{path} = {literal}", record


@settings(max_examples=1500, deadline=None)
@given(key_filters_and_records())
def test_a_key_filter_matches_records_as_the_compiled_filter_does(case: tuple[str, dict]) -> None:
    """The shape's function, given this text's literal, is the parser's filter's."""
    text, record = case
    built = compile_key_filter(text)
    assert built is not None
    assert built.matches(record) is compile_filter(text).matches(record)
    assert built.equalities(["/id"]) == compile_filter(text).equalities(["/id"])


@settings(max_examples=1500, deadline=None)
@given(key_filters_and_records())
def test_a_key_equality_matches_records_as_the_compiled_filter_does(
    case: tuple[str, dict],
) -> None:
    """KeyEquality (a gateway's look-up by key, no Filter built) decides every record as
    the parser's filter: a field of the literal's type by `==`, anything else by the
    filter itself; and it pins the key the filter's equalities give."""
    text, record = case
    equality = KeyEquality.of(text)
    assert equality is not None
    compiled = compile_filter(text)
    assert equality.matches(record) is compiled.matches(record)
    assert equality.matches([record]) is compiled.matches([record])  # not an object
    [pinned] = compiled.equalities([equality.path])  # type: ignore[misc]
    assert equality.key == key_from_values(pinned)


@settings(max_examples=1000, deadline=None)
@given(near_key_filters())
def test_a_key_equality_takes_the_texts_key_equality_takes(text: str) -> None:
    """Any text: a KeyEquality of exactly the texts built without the parser, its path
    the parsed tree's."""
    equality, tree = KeyEquality.of(text), key_equality(text)
    assert (equality is None) == (tree is None)
    if equality is not None:
        assert tuple(equality.steps) == tree.left.steps  # type: ignore[union-attr]
        assert equality.literal == tree.right.value  # type: ignore[union-attr]
        assert type(equality.literal) is type(tree.right.value)  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("text", "record", "matches"),
    [
        ("/id = 42", {"id": 42}, True),
        ("/id = 42", {"id": 42.0}, True),
        ("/id = 42", {"id": "42"}, compile_filter("/id = 42").matches({"id": "42"})),
        ("  /a/b = -7 ", {"a": {"b": -7}}, True),
        ("/name = 'x y'", {"name": "x y"}, True),
        ("/name = 'x y'", {"name": "x"}, False),
    ],
)
def test_key_filters_of_the_shape_are_built_and_match_as_compiled(
    text: str, record: dict, matches: bool
) -> None:
    built = compile_key_filter(text)
    assert built is not None
    assert built.matches(record) is matches
    assert built.matches(record) == compile_filter(text).matches(record)


@pytest.mark.parametrize(
    "text", ["/id = ''", "/id = 1.5", "/id = 'it''s'", "/id = 'a\\b'", "/é = 1", "/id > 1"]
)
def test_other_texts_are_left_to_the_parser(text: str) -> None:
    assert key_equality(text) is None
    try:
        compile_filter(text)
    except FilterError:
        pytest.fail(f"{text!r} is a valid filter the parser compiles")
