"""The compiled code agrees with the naive reference interpreter on generated filters and records.

Expressions are generated as text from the grammar (so the parser is exercised too), parsed
once, then evaluated by the generated code and by tests/expr/reference.py on the same tree.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from amps_on_kafka.expr import compile_expression, compile_filter
from amps_on_kafka.expr.codegen import build
from amps_on_kafka.expr.parser import parse
from tests.expr import reference

KEYS = ["a", "b", "c", "55"]
PATHS = ["/a", "/b", "/c", "/55", "/a/b", "/a[0]", "/b[1]", "/c/a/b/c/55"]
TEXTS = ["", "x", "ab", "B", "1", "1.5", "-2", "1e3", "true", "10", "a'b"]

# -- records -----------------------------------------------------------------------------------

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-5, 5),
    st.integers(),
    st.sampled_from([10**400, -(10**400)]),
    st.floats(allow_nan=False, width=64),
    st.sampled_from(TEXTS),
)
values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.sampled_from(KEYS), inner, max_size=3)
    ),
    max_leaves=6,
)
records = st.fixed_dictionaries({}, optional={key: values for key in KEYS})

# -- filter text -------------------------------------------------------------------------------


def quoted(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


literals = st.one_of(
    st.integers(-5, 5).map(str),
    st.floats(-10, 10, allow_nan=False).map(repr),
    st.sampled_from(TEXTS).map(quoted),
    st.sampled_from(["true", "FALSE", "NULL", "1e400"]),
)
operands = literals | st.sampled_from(PATHS)


def calls(inner: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    one = st.sampled_from(["UPPER", "LOWER", "LENGTH", "ABS", "FLOOR", "CEILING", "ROUND"])
    two = st.sampled_from(["INSTR", "INSTR_I", "STREQUAL_I", "SUBSTR", "ROUND"])
    many = st.sampled_from(["CONCAT", "COALESCE"])
    return st.one_of(
        st.tuples(one, inner).map(lambda t: f"{t[0]}({t[1]})"),
        st.tuples(two, inner, inner).map(lambda t: f"{t[0]}({t[1]}, {t[2]})"),
        st.tuples(many, st.lists(inner, min_size=1, max_size=3)).map(
            lambda t: f"{t[0]}({', '.join(t[1])})"
        ),
    )


def value_exprs(inner: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    arith = st.tuples(inner, st.sampled_from(["+", "-", "*", "/", "%"]), inner)
    return st.one_of(
        arith.map(lambda t: f"({t[0]} {t[1]} {t[2]})"),
        inner.map(lambda v: f"-({v})"),
        calls(inner),
    )


values_text = st.recursive(operands, value_exprs, max_leaves=4)
# LIKE runs on RE2, the reference on Python's re: these are patterns both read alike
# (no \\w or \\d, which RE2 keeps to ASCII), counted repeats and lazy forms included.
patterns = st.sampled_from(
    [
        *("'^a'", "'b$'", "'(?i)x'", "'1'", "'^$'", "''", "'.'", "'^t'", "'[ab]+$'"),
        *("'^(ab)*$'", "'a|t'", "'(?i)^T'", "'x*'", "'.{2,3}'", "'^.?$'", "'[^a-z]'"),
        *("'e(ue)?$'", "'^-?[0-9]+$'", "'^.*?b'", "'(a|b){2}'"),
    ]
)


def predicates(v: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    subject = st.sampled_from(PATHS) | v
    compare = st.tuples(subject, st.sampled_from(["=", "==", "!=", "<>", "<", "<=", ">", ">="]), v)
    negation = st.sampled_from(["", "NOT "])
    return st.one_of(
        compare.map(lambda t: f"{t[0]} {t[1]} {t[2]}"),
        st.tuples(subject, negation).map(lambda t: f"{t[0]} IS {t[1]}NULL"),
        st.tuples(subject, negation, v, v).map(lambda t: f"{t[0]} {t[1]}BETWEEN {t[2]} AND {t[3]}"),
        st.tuples(subject, negation, st.lists(v, min_size=1, max_size=4)).map(
            lambda t: f"{t[0]} {t[1]}IN ({', '.join(t[2])})"
        ),
        st.tuples(subject, negation, st.lists(literals, min_size=1, max_size=3)).map(
            lambda t: f"{t[0]} {t[1]}IN ({', '.join(t[2])})"
        ),
        st.tuples(subject, negation, patterns).map(lambda t: f"{t[0]} {t[1]}LIKE {t[2]}"),
        st.tuples(
            subject,
            negation,
            st.sampled_from(["BEGINS", "ENDS"]),
            st.lists(literals, min_size=1, max_size=3),
        ).map(lambda t: f"{t[0]} {t[1]}{t[2]} WITH ({', '.join(t[3])})"),
        v,
    )


def conditions(inner: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    return st.one_of(
        st.tuples(inner, st.sampled_from(["AND", "OR", "and", "Or"]), inner).map(
            lambda t: f"({t[0]} {t[1]} {t[2]})"
        ),
        inner.map(lambda c: f"NOT ({c})"),
        inner.map(lambda c: f"({c}) = true"),
    )


filters = st.recursive(predicates(values_text), conditions, max_leaves=5)

DIFF = settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@DIFF
@given(filters, st.lists(records, min_size=1, max_size=5))
def test_compiled_filter_agrees_with_reference(text, batch):
    compiled, tree = compile_filter(text), parse(text)
    for record in batch:
        assert compiled.matches(record) is reference.matches(tree, record), (text, record)


@DIFF
@given(values_text | filters, st.lists(records, min_size=1, max_size=5))
def test_compiled_expression_agrees_with_reference(text, batch):
    compiled, tree = compile_expression(text), parse(text)
    for record in batch:
        got, want = compiled.evaluate(record), reference.evaluate_expression(tree, record)
        assert reference.same(got, want), (text, record, got, want)


@DIFF
@given(filters, records)
def test_exact_arithmetic_variant_agrees_with_reference(text, record):
    tree = parse(text)
    assert build(tree, True, fast_arith=False)(record) is reference.matches(tree, record)


# -- every fast path against every awkward value -------------------------------------------------

EDGE_VALUES = [
    None,
    "",
    "x",
    "b",
    "B",
    "1",
    "1.5",
    "10",
    "abc",
    "true",
    0,
    1,
    -1,
    1.5,
    2,
    10,
    True,
    False,
    [],
    [""],
    [None],
    ["x", 1],
    [1, 2],
    [[1]],
    {},
    {"b": 1},
    10**400,
]
EDGE_LITERALS = ["1", "1.5", "'x'", "'b'", "'1'", "'10'", "true", "NULL"]
FAST_PATH_FORMS = (
    [f"/a {op} {lit}" for op in ("=", "!=", "<", "<=", ">", ">=") for lit in EDGE_LITERALS]
    + [f"{lit} < /a" for lit in EDGE_LITERALS]
    + [
        "/a IN (1, 2)",
        "/a IN (1.5, 10)",
        "/a IN ('x', 'b')",
        "/a IN ('1', 'x')",
        "/a IN (1, 'x')",
        "/a IN ('x', NULL)",
        "/a IN (/a)",
        "/a BETWEEN 1 AND 10",
        "/a BETWEEN 'a' AND 'c'",
        "/a BETWEEN 1 AND 'c'",
        "/a LIKE 'x'",
        "/a LIKE '^$'",
        "/a LIKE '.*'",
        "/a LIKE '1'",
        "/a BEGINS WITH ('x', 'a')",
        "/a ENDS WITH ('b', 1)",
        "/a BEGINS WITH ('', 't')",
        "/a IS NULL",
        "/a",
        "/a + 1 > 2",
        "/a * 2.0 >= 3",
        "/a / 2 < 1",
        "/a % 2 = 1",
        "-/a < 0",
        "UPPER(/a) = 'X'",
        "(/a = 1) = false",
        "/a[0] = 1",
        "/a/b = 1",
    ]
)


@pytest.mark.parametrize("form", FAST_PATH_FORMS)
def test_fast_paths_agree_with_reference_on_edge_values(form):
    for text in (form, f"NOT ({form})"):
        compiled, tree = compile_filter(text), parse(text)
        for edge in EDGE_VALUES:
            record = {"a": edge}
            assert compiled.matches(record) is reference.matches(tree, record), (text, edge)


HELPERS = ["_compare", "_in", "_between", "_like", "_affix", "_truth", "_arith", "_negate"]
SAME_TYPED = [
    ("/sym = 'IBM' AND /qty > 100", {"sym": "IBM", "qty": 150}),
    ("/sym = 'IBM' AND /qty > 100", {"sym": "MSFT", "qty": 150}),
    ("/sym IN ('IBM', 'MSFT') OR /qty IN (1, 2)", {"sym": "X", "qty": 3}),
    ("/qty BETWEEN 1 AND 10 AND /sym LIKE '^I'", {"sym": "IBM", "qty": 5}),
    ("/sym BEGINS WITH ('I') AND NOT /sym ENDS WITH ('X')", {"sym": "IBM"}),
    ("/price * /qty > 1000 AND -/qty < 0", {"price": 12.5, "qty": 100}),
    ("/account/region = 'EMEA'", {"account": {"region": "EMEA"}}),
]


@pytest.mark.parametrize(("text", "record"), SAME_TYPED)
def test_common_case_is_inlined_without_helper_calls(text, record):
    run = build(parse(text), True)  # a private copy: its globals are patched below

    def forbidden(*_args: object) -> None:
        raise AssertionError(f"slow path taken for {text!r}")

    for helper in HELPERS:
        run.__globals__[helper] = forbidden
    assert run(record) is reference.matches(parse(text), record)
