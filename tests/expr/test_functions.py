"""The built-in functions."""

from __future__ import annotations

import time

import pytest

from amps_on_kafka.expr import FilterError, compile_filter
from tests.expr.helpers import match, value


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("UPPER('abc')", "ABC"),
        ("LOWER('AbC')", "abc"),
        ("LENGTH('abcd')", 4),
        ("LENGTH(12.5)", 4),
        ("SUBSTR('abcdef', 2)", "bcdef"),
        ("SUBSTR('abcdef', 2, 3)", "bcd"),
        ("SUBSTR('abcdef', 0, 2)", "ab"),
        ("SUBSTR('abcdef', -2)", "ef"),
        ("SUBSTR('abcdef', 2.9, 1)", "b"),
        ("CONCAT('a', 1, true)", "a1true"),
        ("INSTR('banana', 'an')", 2),
        ("INSTR('banana', 'x')", 0),
        ("INSTR('banana', 'AN')", 0),
        ("INSTR_I('banana', 'AN')", 2),
        ("STREQUAL_I('IbM', 'ibm')", True),
        ("STREQUAL_I('IbM', 'ibx')", False),
        ("COALESCE(NULL, '', 3, 4)", 3),
        ("ABS(-2.5)", 2.5),
        ("ABS('-3')", 3),
        ("ROUND(2.5)", 3.0),
        ("ROUND(-2.5)", -3.0),
        ("ROUND(2.675, 2)", 2.68),
        ("ROUND(1234, -2)", 1200),
        ("ROUND(7)", 7),
        ("FLOOR(-1.5)", -2),
        ("CEILING(1.2)", 2),
        ("FLOOR(3)", 3),
    ],
)
def test_function_results(text, expected):
    result = value(text)
    assert result == expected
    assert type(result) is type(expected)


def test_function_names_are_case_insensitive():
    assert value("upper('a')") == "A"
    assert value("Coalesce(NULL, 1)") == 1


def test_now_is_seconds_since_the_epoch():
    before = time.time()
    now = value("NOW()")
    assert isinstance(now, float)
    assert before <= now <= time.time()
    assert match("/ts < NOW()", {"ts": before - 60})
    assert not match("/ts < NOW()", {"ts": before + 3600})


@pytest.mark.parametrize(
    "text",
    [
        "UPPER(/x)",
        "LENGTH(/x)",
        "SUBSTR(/x, 1)",
        "SUBSTR('abc', /x)",
        "INSTR(/x, 'a')",
        "STREQUAL_I(/x, 'a')",
        "ABS(/x)",
        "ROUND(1.5, /x)",
        "FLOOR(/x)",
    ],
)
def test_null_argument_gives_null(text):
    assert value(text, {}) is None


def test_concat_skips_nulls_and_all_null_is_null():
    assert value("CONCAT(/x, 'a', /y, 'b')", {}) == "ab"
    assert value("CONCAT(/x, '')", {}) is None


def test_empty_results_are_null():
    assert value("SUBSTR('abc', 9)") is None
    assert value("SUBSTR('abc', 1, 0)") is None


@pytest.mark.parametrize(
    "text",
    ["ABS('abc')", "FLOOR(/inf)", "ROUND(/inf)", "ROUND('x')", "SUBSTR('abc', 'x')", "UPPER(/obj)"],
)
def test_inapplicable_arguments_give_null(text):
    assert value(text, {"inf": 1e308 * 10, "obj": {"a": 1}}) is None


def test_functions_in_filters():
    record = {"sym": "ibm", "name": "International"}
    assert match("UPPER(/sym) = 'IBM' AND LENGTH(/name) > 5", record)
    assert match("STREQUAL_I(/sym, 'IBM')", record)


def test_unknown_function_is_a_compile_error_naming_it():
    with pytest.raises(FilterError, match="unknown function 'FROB'"):
        compile_filter("FROB(/a) = 1")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("UPPER() = 'A'", "UPPER takes 1 argument, got 0"),
        ("SUBSTR('a') = 'A'", "SUBSTR takes 2 to 3 arguments, got 1"),
        ("NOW(1) > 0", "NOW takes 0 arguments, got 1"),
        ("COALESCE() = 1", "COALESCE takes at least 1 argument"),
    ],
)
def test_wrong_argument_count_is_a_compile_error(text, message):
    with pytest.raises(FilterError, match=message):
        compile_filter(text)
