"""Compile errors name a position; nothing but FilterError ever escapes, whatever the input."""

from __future__ import annotations

import re
import sys

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from amps_on_kafka.expr import FilterError, compile_expression, compile_filter
from amps_on_kafka.expr.parser import MAX_BYTES, MAX_DEPTH
from tests.expr.helpers import match


def error_of(text: object) -> str:
    with pytest.raises(FilterError) as caught:
        compile_filter(text)  # type: ignore[arg-type]
    return str(caught.value)


def test_syntax_error_names_one_based_position_expected_found_and_filter():
    assert error_of("/a IN (1, 2") == (
        "at position 12: expected ')' but found end of filter in \"/a IN (1, 2\""
    )


@pytest.mark.parametrize(
    ("text", "start"),
    [
        ("/a = = 1", "at position 6: expected a value"),
        ("/a = 1 'x'", "at position 8: expected an operator or end of filter but found \"'x'\""),
        ("", "at position 1: expected an expression but found end of filter"),
        ("/a = 'open", "at position 6: unterminated string literal"),
        ("/a = 1 # 2", "at position 8: unexpected character '#'"),
        ("/a BETWEEN 1 OR 2", "at position 14: expected AND but found 'OR'"),
        ("/a IS 5", "at position 7: expected NULL but found '5'"),
        ("/ a = 1", "at position 1: expected a field name after '/'"),
        ("sym = 'IBM'", "at position 1: expected a value (a /path, a literal, a function call"),
        ("/a BEGINS ('x')", "at position 11: expected WITH but found '('"),
        ("(/a = 1", "at position 8: expected ')' but found end of filter"),
    ],
)
def test_syntax_errors(text, start):
    assert error_of(text).startswith(start)


def test_like_pattern_must_be_a_literal():
    assert error_of("/a LIKE /b").startswith(
        "at position 9: expected a string literal (LIKE patterns must be literals)"
    )


def test_invalid_regular_expression_is_a_compile_error():
    assert error_of("/a LIKE '(unclosed'").startswith(
        "at position 9: invalid LIKE pattern: missing ): (unclosed"
    )


def test_affix_list_must_hold_literals():
    assert error_of("/a BEGINS WITH (/b)").startswith("at position 17: expected a literal")


def test_long_filter_is_quoted_around_the_error():
    message = error_of("/a = 1 OR " * 50 + "/a = = 1")
    assert message.startswith("at position 506:")
    assert '"...' in message
    assert len(message) < 200


def test_error_is_a_value_error_too():
    with pytest.raises(ValueError, match="position"):
        compile_filter("/a =")


@pytest.mark.parametrize("bad", [None, b"/a = 1", 42, ["/a = 1"]])
def test_non_string_input_is_a_filter_error(bad):
    assert "must be a string" in error_of(bad)
    with pytest.raises(FilterError):
        compile_expression(bad)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "text",
    [
        "(" * 5000 + "/a = 1" + ")" * 5000,
        "NOT " * 5000 + "/a = 1",
        "-" * 5000 + "/a = 1",
        "+".join(["/a"] * 5000) + " = 1",
        "UPPER(" * 5000 + "/a" + ")" * 5000 + " = 'A'",
    ],
    ids=["parentheses", "not", "minus", "left-deep", "calls"],
)
def test_deep_nesting_is_a_filter_error_not_a_recursion_error(text):
    assert f"nested more than {MAX_DEPTH} levels deep" in error_of(text)


def test_nesting_up_to_the_limit_compiles():
    depth = MAX_DEPTH - 2
    assert match("(" * depth + "/a = 1" + ")" * depth, {"a": 1})
    assert match("+".join(["/a"] * (MAX_DEPTH - 1)) + f" = {MAX_DEPTH - 1}", {"a": 1})
    assert match("ABS(" * (MAX_DEPTH - 2) + "/a" + ")" * (MAX_DEPTH - 2) + " = 1", {"a": -1})
    assert match("NOT " * (MAX_DEPTH - 2) + "/a = 1", {"a": 1})


def test_compiling_on_an_almost_exhausted_stack_is_a_filter_error():
    text = "(" * (MAX_DEPTH - 1) + "/a = 1" + ")" * (MAX_DEPTH - 1)

    def recurse(levels: int) -> str:
        if levels:
            return recurse(levels - 1)
        return error_of(text)

    assert "nested too deeply" in recurse(sys.getrecursionlimit() - _stack_depth() - 60)


def _stack_depth() -> int:
    frame, depth = sys._getframe(), 0
    while frame is not None:
        frame, depth = frame.f_back, depth + 1
    return depth


def test_overlong_filter_is_a_filter_error():
    text = "/a = '" + "x" * MAX_BYTES + "'"
    assert f"longer than {MAX_BYTES} bytes" in error_of(text)
    wide = "/a = '" + "é" * (MAX_BYTES // 2) + "'"
    assert f"longer than {MAX_BYTES} bytes" in error_of(wide)


def test_long_legal_filter_compiles():
    """Thousands of values fit in IN (thousands of ORed equalities are too many operations,
    see test_bounds)."""
    text = "/id IN (" + ", ".join(str(i) for i in range(3000)) + ")"
    assert len(text) < MAX_BYTES
    f = compile_filter(text)
    assert f.matches({"id": 2999})
    assert not f.matches({"id": 3000})


# -- nothing else escapes ----------------------------------------------------------------------

TOKENS = [
    "/a",
    "/b/c",
    "/x[0]",
    "/55",
    "1",
    "-2.5",
    "'s'",
    "''",
    '"q"',
    "NULL",
    "true",
    "(",
    ")",
    ",",
    "=",
    "<>",
    "<=",
    "+",
    "-",
    "*",
    "/",
    "%",
    "AND",
    "OR",
    "NOT",
    "IN",
    "LIKE",
    "'^a'",
    "BETWEEN",
    "IS",
    "BEGINS",
    "ENDS",
    "WITH",
    "UPPER",
    "SUBSTR",
    "NOW",
    "ROUND",
    "(?",
    "'",
    "[",
    "]",
    "1e999",
]
token_soup = st.lists(st.sampled_from(TOKENS), max_size=25).map(" ".join)
json_like = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=5),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner, max_size=3)
    ),
    max_leaves=8,
)
COVERAGE_FILTERS = [
    "/a = 1",
    "/a != 'x'",
    "/a > /b",
    "/a + /b * 2 > 1",
    "/a / /b < 1",
    "/a % 3 = 1",
    "-/a < 0",
    "/a IN (1, 'x', true, NULL)",
    "/a IN (1, 2)",
    "/a NOT IN ('p', 'q')",
    "/a LIKE '^x'",
    "/a NOT LIKE 'y'",
    "/a BETWEEN 1 AND 'z'",
    "/a BEGINS WITH ('x', 1, NULL)",
    "/a ENDS WITH ('x')",
    "/a IS NULL",
    "/a",
    "NOT /a",
    "/a[0]/b = 1",
    "/a/b/c/d/e/f = 1",
    "UPPER(/a) = 'X'",
    "SUBSTR(/a, /b, /c) = 'x'",
    "ROUND(/a, /b) > 1",
    "FLOOR(/a) = CEILING(/b)",
    "CONCAT(/a, /b) = 'x'",
    "COALESCE(/a, /b) = 1",
    "INSTR_I(/a, /b) > 0",
    "ABS(/a) < 1",
    "LENGTH(/a) > 1",
    "STREQUAL_I(/a, /b)",
    "(/a = 1) = /b",
]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.text(max_size=40) | token_soup)
def test_random_text_compiles_or_raises_filter_error(text):
    try:
        compiled = compile_filter(text)
    except FilterError as exc:
        assert re.match(r"(at position \d+: |filter )", str(exc))
    else:
        assert isinstance(compiled.matches({"a": 1}), bool)


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(st.sampled_from(["a", "b", "c", "x"]), json_like, max_size=4) | json_like)
def test_random_records_never_raise(record):
    for text in COVERAGE_FILTERS:
        assert isinstance(compile_filter(text).matches(record), bool)
        compile_expression(text).evaluate(record)
