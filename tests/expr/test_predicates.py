"""The rules for BETWEEN, IN, LIKE, BEGINS/ENDS WITH, arithmetic and arrays."""

from __future__ import annotations

import pytest

from tests.expr.helpers import match, unknown, value

# -- BETWEEN -----------------------------------------------------------------------------------


def test_between_is_inclusive():
    assert [match("/a BETWEEN 2 AND 4", {"a": x}) for x in (1, 2, 3, 4, 5)] == [
        False,
        True,
        True,
        True,
        False,
    ]


def test_not_between():
    assert [match("/a NOT BETWEEN 2 AND 4", {"a": x}) for x in (1, 3, 5)] == [True, False, True]


def test_between_strings_and_mixed_types():
    assert match("/a BETWEEN 'b' AND 'd'", {"a": "c"})
    assert match("/a BETWEEN 1 AND 10", {"a": "5"})
    assert match("/a BETWEEN /lo AND /hi", {"a": 5, "lo": 1, "hi": 9})


def test_between_with_null_is_unknown():
    assert unknown("/a BETWEEN 1 AND 5", {})
    assert unknown("/a BETWEEN /lo AND 5", {"a": 3})
    assert not match("/a BETWEEN /lo AND 5", {"a": 9})  # above the known bound: false anyway
    assert match("/a NOT BETWEEN /lo AND 5", {"a": 9})


# -- IN ----------------------------------------------------------------------------------------


def test_in_list():
    assert match("/sym IN ('IBM', 'MSFT')", {"sym": "MSFT"})
    assert not match("/sym IN ('IBM', 'MSFT')", {"sym": "AAPL"})
    assert match("/n IN (1, 2.5)", {"n": 2.5})


def test_not_in_list():
    assert match("/sym NOT IN ('IBM', 'MSFT')", {"sym": "AAPL"})
    assert not match("/sym NOT IN ('IBM', 'MSFT')", {"sym": "IBM"})


def test_in_coerces_like_equals():
    assert match("/n IN ('1', '2')", {"n": 2})
    assert match("/s IN (1, 2)", {"s": "2.0"})
    assert not match("/b IN (1, 0)", {"b": True})


def test_in_items_may_be_expressions():
    assert match("/a IN (/b + 1, 100)", {"a": 3, "b": 2})


def test_null_on_either_side_of_in_never_matches():
    assert unknown("/x IN (1, 2)", {})
    assert match("/a IN (1, NULL)", {"a": 1})
    assert unknown("/a IN (2, NULL)", {"a": 1})
    assert not match("/a NOT IN (2, NULL)", {"a": 1})
    assert unknown("/a IN ('')", {"a": ""})


# -- LIKE --------------------------------------------------------------------------------------


def test_like_is_an_unanchored_regular_expression():
    assert match("/s LIKE 'B'", {"s": "IBM"})
    assert match("/s LIKE 'I.M'", {"s": "xIBMx"})
    assert not match("/s LIKE 'Z'", {"s": "IBM"})


def test_like_anchors():
    assert match("/s LIKE '^IB'", {"s": "IBM"})
    assert not match("/s LIKE '^BM'", {"s": "IBM"})
    assert match("/s LIKE 'BM$'", {"s": "IBM"})
    assert not match("/s LIKE '^I$'", {"s": "IBM"})


def test_like_is_case_sensitive_unless_flagged():
    assert not match("/s LIKE 'ibm'", {"s": "IBM"})
    assert match("/s LIKE '(?i)ibm'", {"s": "IBM"})


def test_not_like():
    assert match("/s NOT LIKE '^A'", {"s": "IBM"})
    assert not match("/s NOT LIKE '^I'", {"s": "IBM"})
    assert unknown("/s LIKE '.*'", {})


def test_like_matches_the_text_of_numbers_and_booleans():
    assert match("/n LIKE '^12\\.5$'", {"n": 12.5})
    assert match("/n LIKE '^42$'", {"n": 42})
    assert match("/b LIKE '^true$'", {"b": True})


def test_like_empty_string_value_or_pattern_is_unknown():
    assert unknown("/s LIKE '^$'", {"s": ""})
    assert unknown("/s LIKE ''", {"s": "abc"})


# -- BEGINS WITH / ENDS WITH -------------------------------------------------------------------


def test_begins_with_any_of_the_literals():
    assert match("/s BEGINS WITH ('IB', 'MS')", {"s": "MSFT"})
    assert not match("/s BEGINS WITH ('IB', 'MS')", {"s": "AAPL"})
    assert match("/s NOT BEGINS WITH ('IB')", {"s": "AAPL"})


def test_ends_with_any_of_the_literals():
    assert match("/s ends with ('.N', '.L')", {"s": "VOD.L"})
    assert not match("/s ENDS WITH ('.N')", {"s": "VOD.L"})
    assert match("/s NOT ENDS WITH ('.N')", {"s": "VOD.L"})


def test_affixes_of_numbers_use_their_text():
    assert match("/n BEGINS WITH (12)", {"n": 123})
    assert match("/s ENDS WITH (5)", {"s": "x5"})


def test_affix_null_rules():
    assert unknown("/s BEGINS WITH ('a')", {})
    assert match("/s BEGINS WITH ('a', NULL)", {"s": "abc"})
    assert unknown("/s BEGINS WITH ('z', NULL)", {"s": "abc"})


# -- arithmetic --------------------------------------------------------------------------------


def test_arithmetic_precedence():
    assert value("2 + 3 * 4") == 14
    assert value("(2 + 3) * 4") == 20
    assert value("10 - 4 - 3") == 3
    assert value("2 * 9 % 4") == 2


def test_unary_minus():
    assert value("-/a", {"a": 3}) == -3
    assert value("- -/a", {"a": 3}) == 3
    assert value("2 - -1") == 3


def test_division_is_exact_and_modulo_follows_python():
    assert value("7 / 2") == 3.5
    assert value("7 % 3") == 1
    assert value("-7 % 3") == 2
    assert value("7.5 % 2") == 1.5


@pytest.mark.parametrize("text", ["/a / 0", "/a % 0", "/a / 0.0", "/a % /z"])
def test_division_by_zero_is_null(text):
    assert value(text, {"a": 5, "z": 0}) is None


def test_arithmetic_on_null_is_null():
    assert value("/missing + 1", {}) is None
    assert value("/a * 2", {"a": ""}) is None
    assert unknown("/missing + 1 > 0", {})


def test_arithmetic_converts_numeric_strings_only():
    assert value("/a + 1", {"a": "41"}) == 42
    assert value("/a + 1", {"a": "4.5"}) == 5.5
    assert value("/a + 1", {"a": "abc"}) is None
    assert value("/a + 1", {"a": True}) is None
    assert value("/a + 1", {"a": {"b": 1}}) is None


def test_arithmetic_overflow_is_null():
    assert value("/a * 2.0", {"a": 10**400}) is None
    assert value("/a / 3", {"a": 10**400}) is None
    assert not match("/a * 2.0 > 1", {"a": 10**400})
    assert match("/a * 2 > 1", {"a": 10**400})


def test_arithmetic_compares_in_filters():
    assert match("/price * /qty > 1000", {"price": 10.5, "qty": 100})
    assert not match("/price * /qty > 1000", {"price": 9.5, "qty": 100})


# -- arrays ------------------------------------------------------------------------------------


def test_comparison_matches_if_any_element_matches():
    record = {"tags": ["a", "b"], "n": [1, 5]}
    assert match("/tags = 'b'", record)
    assert not match("/tags = 'c'", record)
    assert match("/n > 4", record)
    assert match("/tags != 'a'", record)


def test_in_like_between_and_affixes_match_any_element():
    record = {"tags": ["alpha", "beta"], "n": [1, 5]}
    assert match("/tags IN ('beta', 'gamma')", record)
    assert match("/tags LIKE '^b'", record)
    assert match("/n BETWEEN 4 AND 6", record)
    assert match("/tags ENDS WITH ('ta')", record)


def test_negated_keyword_forms_on_arrays_mean_no_element_matches():
    record = {"tags": ["alpha", "beta"]}
    assert not match("/tags NOT IN ('beta')", record)
    assert match("/tags NOT IN ('gamma')", record)
    assert not match("/tags NOT LIKE '^b'", record)


def test_null_elements_make_a_miss_unknown():
    assert match("/a = 1", {"a": [None, 1]})
    assert unknown("/a = 2", {"a": [None, 1]})


def test_arithmetic_and_functions_use_the_first_element():
    record = {"a": [10, 20], "s": ["abc", "xyz"]}
    assert value("/a + 1", record) == 11
    assert value("UPPER(/s)", record) == "ABC"


def test_empty_array_is_null():
    record = {"a": []}
    assert unknown("/a = 1", record)
    assert match("/a IS NULL", record)
    assert value("/a + 1", record) is None


def test_nested_arrays_are_not_comparable():
    assert unknown("/a = 1", {"a": [[1]]})
