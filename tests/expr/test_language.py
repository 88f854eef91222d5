"""The language rules: paths, literals, comparison, coercion, logic and NULL."""

from __future__ import annotations

from collections import OrderedDict

import pytest

from amps_on_kafka.expr import Expression, Filter, compile_expression, compile_filter
from tests.expr.helpers import match, unknown, value

# -- API ---------------------------------------------------------------------------------------


def test_compile_filter_returns_a_reusable_filter():
    f = compile_filter("/sym = 'IBM'")
    assert isinstance(f, Filter)
    assert f.matches({"sym": "IBM"}) is True
    assert f.matches({"sym": "MSFT"}) is False
    assert f.text == "/sym = 'IBM'"


def test_compile_expression_returns_value_or_none():
    e = compile_expression("/qty * 2")
    assert isinstance(e, Expression)
    assert e.evaluate({"qty": 21}) == 42
    assert e.evaluate({}) is None


def test_same_text_compiles_to_the_same_filter():
    assert compile_filter("/a = 1") is compile_filter("/a = 1")


@pytest.mark.parametrize("record", [b'{"a": 1}', None, "text", [1, 2], 42])
def test_record_that_is_not_a_dict_has_no_fields(record):
    assert not match("/a = 1", record)
    assert match("/a IS NULL", record)
    assert match("1=1", record)


def test_dict_subclass_records_are_dicts():
    record = OrderedDict(a=OrderedDict(b=1))
    assert match("/a/b = 1", record)


# -- paths -------------------------------------------------------------------------------------


def test_nested_path():
    assert match("/a/b/c = 1", {"a": {"b": {"c": 1}}})


def test_index_is_zero_based():
    record = {"items": [10, 20]}
    assert match("/items[0] = 10", record)
    assert match("/items[1] = 20", record)


def test_index_past_the_end_is_null():
    assert match("/items[2] IS NULL", {"items": [10, 20]})


def test_index_then_field():
    assert match("/orders[1]/sym = 'B'", {"orders": [{"sym": "A"}, {"sym": "B"}]})


def test_numeric_segment_is_a_field_name():
    assert match("/55 = 'IBM' AND /109 = 'X'", {"55": "IBM", "109": "X"})


def test_numeric_segment_does_not_index_an_array():
    assert match("/items/0 IS NULL", {"items": [1]})


def test_field_step_on_an_array_is_null():
    assert match("/items/sym IS NULL", {"items": [{"sym": "A"}]})


def test_field_step_on_a_scalar_is_null():
    assert match("/a/b IS NULL", {"a": 5})


def test_long_paths_resolve():
    record = {"a": {"b": {"c": {"d": {"e": [{"f": 7}]}}}}}
    assert match("/a/b/c/d/e[0]/f = 7", record)
    assert match("/a/b/c/d/e[1]/f IS NULL", record)


def test_slash_directly_after_a_path_continues_it_spaced_slash_divides():
    record = {"a": 10, "2": 99}
    assert value("/a/2", {"a": {"2": 5}}) == 5
    assert value("/a / 2", record) == 5
    assert value("/a /2", record) == 5


# -- literals ----------------------------------------------------------------------------------


def test_keywords_are_case_insensitive():
    record = {"a": 1, "b": None, "c": True}
    assert match("/a = 1 and not /b is not null or /c = FALSE", record)
    assert match("/a In (1) AnD /c = True", record)


def test_single_quoted_string_with_doubled_quote():
    assert match("/name = 'O''Brien'", {"name": "O'Brien"})


def test_double_quoted_string_with_doubled_quote():
    assert match('/name = "say ""hi"""', {"name": 'say "hi"'})


def test_backslash_is_literal_in_strings():
    assert match(r"/p = 'a\b'", {"p": "a\\b"})


@pytest.mark.parametrize(
    ("literal", "expected"),
    [
        ("42", 42),
        ("-42", -42),
        ("+42", 42),
        ("4.25", 4.25),
        ("-0.5", -0.5),
        (".5", 0.5),
        ("1e3", 1000.0),
        ("2.5E-1", 0.25),
    ],
)
def test_numbers_integer_or_decimal_signed(literal, expected):
    result = value(literal)
    assert result == expected
    assert type(result) is type(expected)


def test_literals_containing_quotes_and_braces_are_data_not_code():
    nasty = "x'); __import__('os'); ('{v} {0}"
    escaped = nasty.replace("'", "''")
    assert match(f"/a = '{escaped}'", {"a": nasty})
    assert match(f"/a IN ('{escaped}')", {"a": nasty})
    assert not match(f"/a = '{escaped}'", {"a": "x"})


# -- comparison --------------------------------------------------------------------------------


@pytest.mark.parametrize("op", ["=", "=="])
def test_equals_both_spellings(op):
    assert match(f"/a {op} 5", {"a": 5})
    assert not match(f"/a {op} 5", {"a": 6})


@pytest.mark.parametrize("op", ["!=", "<>"])
def test_not_equals_both_spellings(op):
    assert match(f"/a {op} 5", {"a": 6})
    assert not match(f"/a {op} 5", {"a": 5})


@pytest.mark.parametrize(
    ("op", "below", "equal", "above"),
    [
        ("<", True, False, False),
        ("<=", True, True, False),
        (">", False, False, True),
        (">=", False, True, True),
    ],
)
def test_ordering_operators_on_numbers_and_strings(op, below, equal, above):
    assert [match(f"/a {op} 5", {"a": x}) for x in (4, 5, 6.5)] == [below, equal, above]
    assert [match(f"/a {op} 'm'", {"a": x}) for x in ("a", "m", "z")] == [below, equal, above]


def test_literal_may_be_on_either_side():
    assert match("5 < /a", {"a": 6})
    assert not match("5 < /a", {"a": 5})
    assert match("'IBM' = /sym", {"sym": "IBM"})


def test_int_and_float_compare_numerically():
    assert match("/a = 2", {"a": 2.0})
    assert match("/a < 2.5", {"a": 2})


def test_strings_compare_case_sensitively_by_code_point():
    assert not match("/a = 'ibm'", {"a": "IBM"})
    assert match("/a < 'a'", {"a": "Z"})


def test_two_strings_compare_as_strings_even_if_numeric():
    assert match("/a < '9'", {"a": "10"})
    assert not match("/a = '10'", {"a": "10.0"})


def test_numeric_string_compares_with_number_numerically():
    assert match("/a = 10", {"a": "10.0"})
    assert match("/a > 9", {"a": "10"})
    assert match("/a < 10", {"a": "-1e2"})
    assert match("'7' = 7.0", None)


def test_non_numeric_string_is_greater_than_any_number():
    assert match("/a > 1e300", {"a": "abc"})
    assert match("/a >= 5", {"a": " 5"})
    assert not match("/a < 5", {"a": "abc"})
    assert not match("/a = 5", {"a": "abc"})
    assert match("/a != 5", {"a": "abc"})
    assert match("5 < /a", {"a": "5x"})


def test_booleans_equal_only_booleans():
    assert match("/flag = true", {"flag": True})
    assert match("/flag = FALSE", {"flag": False})
    assert match("/flag != true", {"flag": False})
    assert not match("/flag = 1", {"flag": True})
    assert match("/flag != 1", {"flag": True})
    assert not match("/flag = 'true'", {"flag": True})
    assert not match("/n = true", {"n": 1})


def test_booleans_order_false_before_true_and_not_against_other_types():
    assert match("/flag > false", {"flag": True})
    assert unknown("/flag < 1", {"flag": True})
    assert unknown("/n >= true", {"n": 5})


def test_objects_are_not_comparable():
    assert unknown("/a = 1", {"a": {"b": 1}})
    assert unknown("/a != 'x'", {"a": {"b": 1}})


# -- logic and NULL ----------------------------------------------------------------------------


def test_and_binds_tighter_than_or():
    record = {"a": 1, "b": 0, "c": 0}
    assert match("/a = 1 OR /b = 1 AND /c = 1", record)
    assert not match("(/a = 1 OR /b = 1) AND /c = 1", record)


def test_not_binds_tighter_than_and():
    record = {"a": 1, "b": 2}
    assert match("NOT /a = 2 AND /b = 2", record)
    assert not match("NOT (/a = 1 AND /b = 2)", record)


def test_parentheses_group():
    assert match("((/a = 1))", {"a": 1})


@pytest.mark.parametrize(
    "record", [{}, {"x": None}, {"x": ""}, {"x": []}], ids=["missing", "null", "empty", "[]"]
)
def test_missing_null_and_empty_are_null_and_comparisons_are_unknown(record):
    for condition in ("/x = 1", "/x != 1", "/x < 'a'", "/x = ''", "/x = /x"):
        assert unknown(condition, record)
    assert match("/x IS NULL", record)
    assert not match("/x IS NOT NULL", record)


def test_empty_string_literal_is_null():
    assert unknown("/a = ''", {"a": ""})
    assert match("'' IS NULL", None)


def test_is_null_is_false_for_values_and_objects():
    for present in (0, False, "x", [None], {"k": 1}, {}):
        assert match("/a IS NOT NULL", {"a": present})
        assert not match("/a IS NULL", {"a": present})


def test_not_unknown_is_unknown():
    assert not match("NOT /x = 1", {})
    assert not match("NOT NOT /x = 1", {})


def test_unknown_and_false_is_false_unknown_or_true_is_true():
    record = {"a": 1}
    assert match("NOT (/x = 1 AND /a = 2)", record)
    assert match("/x = 1 OR /a = 1", record)
    assert unknown("/x = 1 AND /a = 1", record)
    assert unknown("/x = 1 OR /a = 2", record)


def test_one_equals_one_matches_everything():
    for record in ({}, {"a": 1}, None, b"raw", [1]):
        assert match("1=1", record)
    assert not match("1=2", {})


def test_bare_boolean_literals_are_filters():
    assert match("true", {})
    assert not match("false", {})
    assert not match("NOT true", {})
    assert match("NOT false", {})


def test_bare_value_is_a_condition_only_when_boolean():
    assert match("/flag", {"flag": True})
    assert not match("/flag", {"flag": False})
    assert match("NOT /flag", {"flag": False})
    for other in (1, "true", None, {}):
        assert unknown("/flag", {"flag": other})
    assert not match("5", {})


def test_condition_as_value_is_true_false_or_null():
    assert value("/a = 1", {"a": 1}) is True
    assert value("/a = 1", {"a": 2}) is False
    assert value("/a = 1", {}) is None
    assert match("(/a = 1) = true", {"a": 1})


def test_expression_normalises_null_values():
    assert value("/a", {"a": ""}) is None
    assert value("/a", {"a": []}) is None
    assert value("/a", {"a": [1, 2]}) == [1, 2]
    assert value("/a", {"a": {"b": 1}}) == {"b": 1}
