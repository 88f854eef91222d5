"""One filter's worst case is bounded (defect 2 of the hardening issue: one query must not
freeze the worker). A filter is compiled on the gateway's event loop, so its compile cost
is bounded; its evaluation runs per record, so its memory is bounded."""

from __future__ import annotations

import time

import pytest

from amps_on_kafka.expr import FilterError, compile_filter
from amps_on_kafka.expr.functions import MAX_TEXT
from amps_on_kafka.expr.parser import (
    MAX_CALLS,
    MAX_DEPTH,
    MAX_NODES,
    MAX_PATTERN_PROGRAM,
    MAX_PATTERNS,
)
from amps_on_kafka.expr.patterns import MAX_PROGRAM, program_size
from tests.expr.helpers import match, value


def error_of(text: str) -> str:
    with pytest.raises(FilterError) as caught:
        compile_filter(text)
    return str(caught.value)


def test_many_heavy_like_patterns_are_refused_at_the_budget_not_compiled_for_seconds() -> None:
    """Unbounded, 2,000 patterns of `(.{100}){10}` compiled for 16 s (holding the GIL on
    the event loop) into 430 MB; the budget stops at the pattern that passes it."""
    heavy = ".{300}"
    per_pattern = program_size(heavy)
    fits = MAX_PATTERN_PROGRAM // per_pattern
    assert match(" OR ".join([f"/s LIKE '{heavy}'"] * fits), {"s": "x" * 1000})
    text = " OR ".join([f"/s LIKE '{heavy}'"] * 2000)
    started = time.perf_counter()
    said = error_of(text)
    assert time.perf_counter() - started < 5  # tokenizing 60 KB and a few compiles
    position = len(" OR ".join([f"/s LIKE '{heavy}'"] * (fits + 1))) - len(heavy) - 1
    assert said.startswith(f"at position {position}: the LIKE patterns are too large together")
    assert f"at most {MAX_PATTERN_PROGRAM} in one filter" in said


def test_a_pattern_whose_program_outgrows_the_dfa_is_refused_by_its_size() -> None:
    """`(.{100}){10}` is 8,004 RE2 instructions: RE2's DFA ran out of room on long texts
    and its NFA fallback took 12 s on 300,000 characters, still linear but by the program."""
    said = error_of("/s LIKE '(.{100}){10}'")
    assert said.startswith("at position 9: invalid LIKE pattern: pattern too large: 8004 RE2")
    assert f"at most {MAX_PROGRAM}" in said


def test_the_largest_pattern_allowed_matches_a_megabyte_without_the_nfa_fallback() -> None:
    """`.{300}x` on 333,333 three-byte characters: 5.7 s when matching had RE2's 1 MiB
    check budget (the DFA thrashed into the NFA), milliseconds with 8 MiB."""
    assert program_size(".{300}x") <= MAX_PROGRAM
    filter = compile_filter("/s LIKE '.{300}x'")
    started = time.perf_counter()
    assert not filter.matches({"s": "\u4e00" * 333_333})
    assert time.perf_counter() - started < 1.0


def test_a_single_pattern_past_re2s_budget_is_refused_quickly() -> None:
    """At RE2's default 8 MiB `\\pL{300}` compiled for 0.3 s; now it is over the budget."""
    said = error_of("/s LIKE '\\pL{300}'")
    assert said.startswith("at position 9: invalid LIKE pattern: pattern too large")


def test_the_number_of_like_patterns_is_bounded() -> None:
    allowed = " OR ".join([f"/s LIKE 'a{i}'" for i in range(MAX_PATTERNS)])
    assert match(allowed, {"s": f"a{MAX_PATTERNS - 1}"})
    said = error_of(allowed + " OR /s LIKE 'b'")
    assert f"more than {MAX_PATTERNS} LIKE patterns" in said
    assert said.startswith(f"at position {len(allowed) + 13}:")


def test_the_number_of_function_calls_is_bounded() -> None:
    """Their results live together (CONCAT's arguments): 500 UPPER(/s) of a 1 MB field
    would have held 2 GB at once."""
    allowed = "CONCAT(" + ", ".join(["UPPER(/s)"] * (MAX_CALLS - 1)) + ")"
    assert value(allowed, {"s": "a"}) == "A" * (MAX_CALLS - 1)
    said = error_of(allowed[:-1] + ", LOWER(/s)) = 'x'")
    assert f"more than {MAX_CALLS} function calls" in said


def test_concat_past_max_text_is_null_not_gigabytes() -> None:
    """CONCAT(/s, /s, ...) with thousands of arguments asked for gigabytes of one record."""
    big = {"s": "x" * (MAX_TEXT // 4 + 1)}
    assert value("LENGTH(CONCAT(/s, /s, /s))", big) == 3 * (MAX_TEXT // 4 + 1)
    assert value("CONCAT(/s, /s, /s, /s)", big) is None
    assert not match("LENGTH(CONCAT(/s, /s, /s, /s)) > 0", big)


def test_ten_thousand_levels_of_nesting_are_a_filter_error() -> None:
    for text in ("(" * 10_000 + "/a = 1" + ")" * 10_000, "NOT " * 10_000 + "/a = 1"):
        assert f"nested more than {MAX_DEPTH} levels deep" in error_of(text)


def test_a_lone_surrogate_in_a_pattern_is_matched_not_an_encoding_error() -> None:
    """A frame's JSON may carry "\\ud800"; its encode raised UnicodeEncodeError, which is
    not a FilterError, out of compile_filter."""
    assert match("/s LIKE '\ud800'", {"s": "x\ud800"})
    assert not match("/s LIKE '\ud800'", {"s": "x"})


def test_the_operations_python_compiles_in_one_call_are_bounded() -> None:
    """compile() of the generated code holds the GIL in one call: 3,000 ORed equalities
    took 250 ms on the event loop. The error names the operation past the limit."""
    terms = [f"/a = {i}" for i in range(MAX_NODES)]
    said = error_of(" OR ".join(terms))
    fits = (MAX_NODES - 1) // 3  # an OR, then a comparison, a path and a literal each
    position = len(" OR ".join(terms[:fits])) + len(" OR ") + 1
    assert said.startswith(f"at position {position}: more than {MAX_NODES} operations")
    assert match(" OR ".join(terms[:fits]), {"a": fits - 1})


def test_a_long_in_list_of_literals_is_one_constant_not_operations() -> None:
    items = ", ".join(str(i) for i in range(10 * MAX_NODES))
    assert match(f"/a IN ({items})", {"a": 10 * MAX_NODES - 1})
