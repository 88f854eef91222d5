"""A deliberately naive tree-walking interpreter of the filter syntax tree: the test oracle.

It shares only the parser (to get the tree) and the built-in functions (called through
``Function.bind``, which the function tests cover on their own) with production.  Paths,
NULL, coercion, arrays, three-valued logic, IN/BETWEEN/LIKE/affixes and arithmetic are
re-implemented here as directly as docs/filters.md states them, without any fast path.
"""

from __future__ import annotations

import math
import operator
import re

from amps_on_kafka.expr import nodes as n
from amps_on_kafka.expr.functions import FUNCTIONS

OPS = {
    "=": operator.eq,
    "!=": operator.ne,
    "<": operator.lt,
    "<=": operator.le,
    ">": operator.gt,
    ">=": operator.ge,
}
ARITH = {
    "+": operator.add,
    "-": operator.sub,
    "*": operator.mul,
    "/": operator.truediv,
    "%": operator.mod,
}
NUMERIC = re.compile(r"[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?")


def matches(root: n.Node, record: object) -> bool:
    """The filter matches exactly when it evaluates to TRUE."""
    return truth(evaluate(root, record)) is True


def evaluate_expression(root: n.Node, record: object) -> object:
    return None if is_null(evaluate(root, record)) else evaluate(root, record)


# -- values -----------------------------------------------------------------------------------


def is_null(value: object) -> bool:
    return value is None or (isinstance(value, str | list) and len(value) == 0)


def is_bool(value: object) -> bool:
    return isinstance(value, bool)


def is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def string_number(text: str) -> object:
    if not NUMERIC.fullmatch(text):
        return None
    return int(text) if re.fullmatch(r"[+-]?[0-9]+", text) else float(text)


def each(value: object) -> list[object]:
    """Elements a lifted predicate looks at; NULL (and each NULL element) is None."""
    found = value if isinstance(value, list) and value else [value]
    return [None if is_null(item) else item for item in found]


def first(value: object) -> object:
    if isinstance(value, list):
        value = value[0] if value else None
    if is_null(value) or not (is_number(value) or is_bool(value) or isinstance(value, str)):
        return None
    return value


def as_number(value: object) -> object:
    value = first(value)
    if is_number(value):
        return value
    return string_number(value) if isinstance(value, str) else None


def text_of(value: object) -> str | None:
    if isinstance(value, str):
        return value
    if is_bool(value):
        return "true" if value else "false"
    if is_number(value):
        return repr(value) if isinstance(value, float) else str(value)
    return None


def truth(value: object) -> bool | None:
    return either([item if is_bool(item) else None for item in each(value)])


def either(results: list[bool | None]) -> bool | None:
    """Three-valued OR."""
    if any(result is True for result in results):
        return True
    if any(result is None for result in results):
        return None
    return False


def both(results: list[bool | None]) -> bool | None:
    """Three-valued AND."""
    if any(result is False for result in results):
        return False
    if any(result is None for result in results):
        return None
    return True


def not3(value: bool | None) -> bool | None:
    return None if value is None else not value


# -- comparison -------------------------------------------------------------------------------


def compare_one(op: str, a: object, b: object) -> bool | None:
    if a is None or b is None:
        return None
    scalar = (str, bool, int, float)
    if not isinstance(a, scalar) or not isinstance(b, scalar):
        return None
    if is_bool(a) or is_bool(b):
        if is_bool(a) and is_bool(b):
            return OPS[op](a, b)
        return {"=": False, "!=": True}.get(op)
    if isinstance(a, str) and is_number(b):
        converted = string_number(a)
        return OPS[op](1, 0) if converted is None else OPS[op](converted, b)
    if is_number(a) and isinstance(b, str):
        converted = string_number(b)
        return OPS[op](0, 1) if converted is None else OPS[op](a, converted)
    return OPS[op](a, b)


def compare(op: str, a: object, b: object) -> bool | None:
    return either([compare_one(op, x, y) for x in each(a) for y in each(b)])


# -- evaluation -------------------------------------------------------------------------------


def resolve(record: object, steps: tuple) -> object:
    current = record
    for step in steps:
        if isinstance(step, str):
            current = current.get(step) if isinstance(current, dict) else None
        else:
            current = current[step] if isinstance(current, list) and step < len(current) else None
    return current


def evaluate(node: n.Node, record: object) -> object:
    match node:
        case n.Literal(value=value):
            return value
        case n.Path(steps=steps):
            return resolve(record, steps)
        case n.Negate(operand=operand):
            number = as_number(evaluate(operand, record))
            return None if number is None else -number
        case n.Arith(op=op, left=left, right=right):
            return arithmetic(op, evaluate(left, record), evaluate(right, record))
        case n.Call(name=name, args=args):
            return FUNCTIONS[name].bind()(*[evaluate(arg, record) for arg in args])
        case n.Compare(op=op, left=left, right=right):
            return compare(op, evaluate(left, record), evaluate(right, record))
        case n.Logical(op="AND", operands=operands):
            return both([truth(evaluate(o, record)) for o in operands])
        case n.Logical(op="OR", operands=operands):
            return either([truth(evaluate(o, record)) for o in operands])
        case n.Not(operand=operand):
            return not3(truth(evaluate(operand, record)))
        case n.IsNull(operand=operand):
            return is_null(evaluate(operand, record))
    return predicate(node, record)


def predicate(node: n.Node, record: object) -> bool | None:
    match node:
        case n.Between(operand=operand, low=low, high=high):
            lo, hi = evaluate(low, record), evaluate(high, record)
            return either(
                [
                    both([compare(">=", item, lo), compare("<=", item, hi)])
                    for item in each(evaluate(operand, record))
                ]
            )
        case n.In(operand=operand, items=items):
            value = evaluate(operand, record)
            return either([compare("=", value, evaluate(item, record)) for item in items])
        case n.Like(operand=operand, pattern=pattern):
            if pattern == "":
                return None
            return either(
                [
                    None if text_of(item) is None else re.search(pattern, text_of(item)) is not None
                    for item in each(evaluate(operand, record))
                ]
            )
        case n.Affix(kind=kind, operand=operand, affixes=affixes, has_null=has_null):
            return either(
                [
                    affix_one(kind, affixes, has_null, item)
                    for item in each(evaluate(operand, record))
                ]
            )
    raise AssertionError(f"unknown node {node!r}")


def affix_one(kind: str, affixes: tuple, has_null: bool, item: object) -> bool | None:
    text = text_of(item)
    if text is None:
        return None
    hit = any(text.startswith(a) if kind == "BEGINS" else text.endswith(a) for a in affixes)
    return True if hit else (None if has_null else False)


def arithmetic(op: str, left: object, right: object) -> object:
    a, b = as_number(left), as_number(right)
    if a is None or b is None:
        return None
    if op in "/%" and b == 0:
        return None
    try:
        return ARITH[op](a, b)
    except OverflowError:
        return None


def same(a: object, b: object) -> bool:
    """Equal values of the same type, NaN equal to itself."""
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return type(a) is type(b) and a == b
