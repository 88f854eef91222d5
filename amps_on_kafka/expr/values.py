"""Run-time value semantics of compiled filters: NULL, coercion, arrays, 3-valued logic.

Generated code inlines the common cases and calls these helpers for everything else, so the
rules live here once.  Three-valued results are ``True``, ``False`` and ``None`` (unknown).
Every helper accepts any Python object without raising, because records come from outside.
"""

from __future__ import annotations

import operator
import re
from collections.abc import Callable
from typing import Any

from amps_on_kafka.expr.lexer import parse_number

Truth = bool | None
CompareOp = Callable[[Any, Any], bool]

_NUMERIC = re.compile(r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?\Z")
NUMBER_TYPES = (int, float)

COMPARE_OPS: dict[str, CompareOp] = {
    "=": operator.eq,
    "!=": operator.ne,
    "<": operator.lt,
    "<=": operator.le,
    ">": operator.gt,
    ">=": operator.ge,
}
ARITH_OPS: dict[str, Callable[[Any, Any], Any]] = {
    "+": operator.add,
    "-": operator.sub,
    "*": operator.mul,
    "/": operator.truediv,
    "%": operator.mod,
}

NUM, STR, BOOL, OTHER = "number", "string", "boolean", "other"


def kind(value: object) -> str:
    """Classify a non-NULL element; ``bool`` is checked first since it subclasses ``int``."""
    if isinstance(value, bool):
        return BOOL
    if isinstance(value, int | float):
        return NUM
    return STR if isinstance(value, str) else OTHER


def to_number(text: str) -> int | float | None:
    """A string's numeric value when the whole string is a decimal number, else None."""
    return parse_number(text) if _NUMERIC.match(text) else None


def to_text(value: object) -> str | None:
    """The text a string function, LIKE or BEGINS/ENDS WITH sees for a scalar, or None."""
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, int):
        try:
            return str(value)
        except ValueError:  # more digits than Python agrees to print
            return None
    return None


def is_null(value: object) -> bool:
    """NULL is a missing field, JSON null, the empty string or the empty array."""
    return value is None or (isinstance(value, str | list) and not value)


def elements(value: object) -> list[object]:
    """What a lifted predicate iterates: the array's elements, or the value; NULL is [None]."""
    if isinstance(value, list) and value:
        return [None if is_null(item) else item for item in value]
    return [None if is_null(value) else value]


def scalar(value: object) -> object:
    """The value arithmetic and functions use: first array element; NULL and objects → None."""
    if isinstance(value, list):
        value = value[0] if value else None
    return None if is_null(value) or kind(value) == OTHER else value


def number(value: object) -> int | float | None:
    """A value as a number for arithmetic: numbers, numeric strings; anything else is None."""
    value = scalar(value)
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return value
    return to_number(value) if isinstance(value, str) else None


def compare_scalars(op: CompareOp, left: object, right: object) -> Truth:
    """Compare two elements (not arrays): the coercion rules of the language live here."""
    if left is None or right is None:
        return None
    kinds = {kind(left), kind(right)}
    if OTHER in kinds:
        return None
    if len(kinds) == 1:
        return op(left, right)
    if BOOL in kinds:
        return _mixed_boolean(op)
    return op(_mixed_key(left), _mixed_key(right))


def _mixed_boolean(op: CompareOp) -> Truth:
    """A boolean equals only a boolean; ordering it against anything else is unknown."""
    if op is operator.eq:
        return False
    return True if op is operator.ne else None


def _mixed_key(value: object) -> tuple[int, object]:
    """Where a number or a string sits when the two meet.

    A numeric string is its number; any other string is above every number.
    """
    if isinstance(value, str):
        converted = to_number(value)
        return (1, 0) if converted is None else (0, converted)
    return (0, value)


def any_of(results: list[Truth]) -> Truth:
    """Three-valued OR of a list."""
    if True in results:
        return True
    return None if None in results else False


def compare(op: CompareOp, left: object, right: object) -> Truth:
    """A comparison lifted over arrays: true when some pair of elements compares true."""
    return any_of([compare_scalars(op, a, b) for a in elements(left) for b in elements(right)])


def between(value: object, low: object, high: object) -> Truth:
    """``value BETWEEN low AND high`` for some element of value, bounds inclusive."""
    results: list[Truth] = []
    for item in elements(value):
        above = compare(operator.ge, item, low)
        below = compare(operator.le, item, high)
        results.append(False if False in (above, below) else above and below)
    return any_of(results)


def in_list(value: object, items: tuple[object, ...]) -> Truth:
    """``value IN (items)``: exactly the OR of ``value = item`` over the items."""
    return any_of([compare(operator.eq, value, item) for item in items])


def like(search: Callable[[str], bool], value: object) -> Truth:
    """True when the pattern matches somewhere in the text of some element."""
    results: list[Truth] = []
    for item in elements(value):
        text = to_text(item)
        results.append(None if text is None else search(text))
    return any_of(results)


def affix(kind_name: str, affixes: tuple[str, ...], has_null: bool, value: object) -> Truth:
    """BEGINS WITH / ENDS WITH over the elements' texts; a NULL affix turns misses unknown."""
    results: list[Truth] = []
    for item in elements(value):
        text = to_text(item)
        if text is None:
            results.append(None)
        elif text.startswith(affixes) if kind_name == "BEGINS" else text.endswith(affixes):
            results.append(True)
        else:
            results.append(None if has_null else False)
    return any_of(results)


def truth(value: object) -> Truth:
    """A value used as a condition: booleans are themselves, arrays any element, else unknown."""
    return any_of([item if isinstance(item, bool) else None for item in elements(value)])


def arith(op: Callable[[Any, Any], Any], left: object, right: object) -> int | float | None:
    """Arithmetic on the first elements; NULL, non-numbers, division by zero, overflow → NULL."""
    a, b = number(left), number(right)
    if a is None or b is None:
        return None
    try:
        return op(a, b)
    except ArithmeticError:
        return None


def negate(value: object) -> int | float | None:
    """Unary minus; NULL for anything that is not a number."""
    found = number(value)
    return None if found is None else -found


def normalise(value: object) -> object:
    """The value an expression hands back: NULLs (``''``, ``[]``) become None."""
    return None if is_null(value) else value
