"""The built-in functions.

Each implementation takes scalars (arrays already reduced to their first element, NULLs to
None) and may raise ``ValueError`` or ``ArithmeticError`` for "not applicable" (a string that
is not a number, an overflow); the wrapper turns that into NULL so nothing escapes a filter.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from decimal import ROUND_HALF_UP, Context, Decimal
from typing import Any

from amps_on_kafka.expr.values import is_null, number, scalar, to_text

_DECIMAL = Context(prec=1000)
_MAX_DIGITS = 400
#: The longest text CONCAT builds (characters); longer is NULL. Unbounded, CONCAT(/s, /s, ...)
#: with thousands of arguments asked for gigabytes from one record and one filter.
MAX_TEXT = 1 << 20


@dataclass(frozen=True, slots=True)
class Function:
    """A function's arity and implementation; ``strict`` ones return NULL on any NULL arg."""

    min_args: int
    max_args: int | None
    impl: Callable[..., Any]
    strict: bool = True

    def arity(self) -> str:
        """The accepted argument count, as error messages phrase it."""
        if self.max_args is None:
            return f"at least {_arguments(self.min_args)}"
        if self.min_args == self.max_args:
            return _arguments(self.min_args)
        return f"{self.min_args} to {_arguments(self.max_args)}"

    def bind(self) -> Callable[..., Any]:
        """The callable compiled code uses: reduces args, applies NULL rules, never raises."""
        impl, strict = self.impl, self.strict

        def call(*args: object) -> object:
            values = [scalar(arg) for arg in args]
            if strict and None in values:
                return None
            try:
                result = impl(*values)
            except (ValueError, ArithmeticError):
                return None
            return None if is_null(result) else result

        return call


def _arguments(count: int) -> str:
    return f"{count} argument" if count == 1 else f"{count} arguments"


def _text(value: object) -> str:
    text = to_text(value)
    if text is None:
        raise ValueError("no text form")
    return text


def _num(value: object) -> int | float:
    result = number(value)
    if result is None:
        raise ValueError("not a number")
    return result


def _substr(value: object, start: object, length: object = None) -> str:
    """1-based start; 0 counts as 1, a negative start counts back from the end."""
    text, first = _text(value), int(_num(start))
    begin = first - 1 if first > 0 else max(0, len(text) + first) if first < 0 else 0
    if length is None:
        return text[begin:]
    return text[begin : begin + max(0, int(_num(length)))]


def _round(value: object, digits: object = 0) -> int | float:
    """Round half away from zero on the number's decimal text, so ROUND(2.675, 2) is 2.68."""
    x = _num(value)
    places = max(-_MAX_DIGITS, min(_MAX_DIGITS, int(_num(digits))))
    if isinstance(x, int) and places >= 0:
        return x
    exact = Decimal(x) if isinstance(x, int) else Decimal(repr(x))
    rounded = exact.quantize(Decimal(1).scaleb(-places), ROUND_HALF_UP, _DECIMAL)
    return int(rounded) if isinstance(x, int) else float(rounded)


def _concat(*values: object) -> str:
    texts = [_text(value) for value in values if value is not None]
    if sum(map(len, texts)) > MAX_TEXT:
        raise ValueError(f"longer than {MAX_TEXT} characters")
    return "".join(texts)


def _coalesce(*values: object) -> object:
    return next((value for value in values if value is not None), None)


FUNCTIONS: dict[str, Function] = {
    "UPPER": Function(1, 1, lambda s: _text(s).upper()),
    "LOWER": Function(1, 1, lambda s: _text(s).lower()),
    "LENGTH": Function(1, 1, lambda s: len(_text(s))),
    "SUBSTR": Function(2, 3, _substr),
    "CONCAT": Function(1, None, _concat, strict=False),
    "INSTR": Function(2, 2, lambda s, sub: _text(s).find(_text(sub)) + 1),
    "INSTR_I": Function(2, 2, lambda s, sub: _text(s).lower().find(_text(sub).lower()) + 1),
    "STREQUAL_I": Function(2, 2, lambda a, b: _text(a).casefold() == _text(b).casefold()),
    "COALESCE": Function(1, None, _coalesce, strict=False),
    "ABS": Function(1, 1, lambda x: abs(_num(x))),
    "ROUND": Function(1, 2, _round),
    "FLOOR": Function(1, 1, lambda x: math.floor(_num(x))),
    "CEILING": Function(1, 1, lambda x: math.ceil(_num(x))),
    "NOW": Function(0, 0, time.time, strict=False),
}
