"""LIKE patterns run on RE2 (defect 2 of the hardening issue: one catastrophic pattern froze
every session of a worker). RE2 is linear in the text; what it cannot do is refused when the
filter compiles, naming the construct."""

from __future__ import annotations

import re
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from amps_on_kafka.errors import FilterError
from amps_on_kafka.expr import compile_filter
from amps_on_kafka.expr.patterns import PatternError, compile_pattern


def test_a_catastrophic_pattern_is_linear() -> None:
    """`(a+)+$` on 27 a's and a b took Python's re 5 s (seconds doubling per character);
    RE2 answers for 100,000 characters in well under the time re needed for 27."""
    matches = compile_pattern("(a+)+$")
    started = time.perf_counter()
    assert not compile_pattern("(a+)+c$")("a" * 100_000 + "b")
    assert matches("a" * 100_000)
    assert time.perf_counter() - started < 1.0


def test_a_catastrophic_filter_through_the_compiled_filter() -> None:
    filter = compile_filter("/name LIKE '(a+)+$' OR /name NOT LIKE '^(x+x+)+y'")
    started = time.perf_counter()
    assert filter.matches({"name": "a" * 27 + "b"})
    assert time.perf_counter() - started < 1.0


@pytest.mark.parametrize(
    ("pattern", "named"),
    [
        (r"(a)\1", "backreferences"),
        ("x(?=a)", "lookahead"),
        ("x(?!a)", "negative lookahead"),
        ("(?<=a)x", "lookbehind"),
        ("(?<!a)x", "negative lookbehind"),
        ("a*+", "possessive quantifiers"),
        (r"a\Z", r"\Z"),
    ],
)
def test_what_re2_lacks_is_refused_by_name(pattern: str, named: str) -> None:
    with pytest.raises(FilterError) as raised:
        compile_filter(f"/a LIKE '{pattern}'")
    assert "at position 9: invalid LIKE pattern: " + named in str(raised.value)
    assert "RE2" in str(raised.value)


@pytest.mark.parametrize(
    ("pattern", "said"),
    [
        ("(\\pL{1000})" * 50, "pattern too large"),  # past RE2's memory budget
        ("((a{20}){20}){20}", "invalid repetition size"),  # RE2's bound on nested counts
    ],
)
def test_a_pattern_too_big_is_refused(pattern: str, said: str) -> None:
    with pytest.raises(PatternError, match=said):
        compile_pattern(pattern)


def test_unicode_and_surrogates() -> None:
    assert compile_pattern("é+$")("café")
    assert compile_pattern("^c.f")("café")
    assert compile_pattern("x")("\ud800x")  # a lone surrogate is matched, not an error


# Patterns both engines read alike: ASCII literals, classes, anchors, groups, alternation,
# and quantifiers (Perl classes such as \w are ASCII in RE2, Unicode in Python's re, so
# the texts are ASCII).
_ATOMS = st.sampled_from(["a", "b", ".", "[ab]", "[^a]", r"\d", r"\w", r"\s", "(a|b)", "(ab)"])
_QUANT = st.sampled_from(["", "*", "+", "?", "{1,2}", "*?", "+?"])
_PATTERNS = st.builds(
    lambda anchor, parts, end: anchor + "".join(parts) + end,
    st.sampled_from(["", "^"]),
    st.lists(st.builds(str.__add__, _ATOMS, _QUANT), min_size=1, max_size=5),
    st.sampled_from(["", "$"]),
)
_TEXTS = st.text(alphabet="ab1 _x\t", max_size=12)


@settings(max_examples=300, deadline=None)
@given(_PATTERNS, _TEXTS)
def test_re2_agrees_with_python_re_on_what_both_support(pattern: str, text: str) -> None:
    assert compile_pattern(pattern)(text) == (re.search(pattern, text) is not None)
