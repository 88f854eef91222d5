"""Tokenizer for the filter language.

The only context-sensitive token is ``/``: where an operand is expected it starts a path
(``/a/b[0]``), after an operand it is division.  A path swallows every directly following
``/segment`` and ``[index]``, so ``/a/2`` is the field ``2`` of ``a`` while ``/a / 2`` divides.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from amps_on_kafka.errors import FilterError

#: Keywords after which an operand (and so a path) is expected rather than an operator.
OPERATOR_WORDS = frozenset(
    {"AND", "OR", "NOT", "IN", "LIKE", "BETWEEN", "IS", "BEGINS", "ENDS", "WITH"}
)

_NUMBER = re.compile(r"(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")
_INTEGER = re.compile(r"[+-]?[0-9]+\Z")
_NAME = re.compile(r"[^\W\d]\w*")
_SEGMENT = re.compile(r"/(\w+)")
_INDEX = re.compile(r"\[([0-9]{1,9})\]")
_STRINGS = {"'": re.compile(r"'((?:[^']|'')*)'"), '"': re.compile(r'"((?:[^"]|"")*)"')}
_OPERATORS = ("==", "!=", "<>", "<=", ">=", "=", "<", ">", "+", "-", "*", "/", "%", "(", ")", ",")


@dataclass(frozen=True, slots=True)
class Token:
    """One token; ``pos`` is the 0-based offset of its first character in the filter."""

    kind: str  # NUM, STR, PATH, NAME, OP or EOF
    text: str
    value: object
    pos: int


def parse_number(text: str) -> int | float:
    """Convert numeric text to int when integral in form, else float.

    Python refuses to parse integers of more than 4300 digits; those become floats.
    """
    if _INTEGER.match(text):
        try:
            return int(text)
        except ValueError:
            return float(text)
    return float(text)


def describe(token: Token) -> str:
    """How an error message names a token."""
    return "end of filter" if token.kind == "EOF" else repr(token.text)


def error(text: str, pos: int, message: str) -> FilterError:
    """Build the error every compile failure raises: 1-based position, message, the filter."""
    return FilterError(f"at position {pos + 1}: {message} in {_excerpt(text, pos)}")


def _excerpt(text: str, pos: int, width: int = 60) -> str:
    """The filter itself, or for long filters the part around the error."""
    if len(text) <= 2 * width:
        return f'"{text}"'
    start = max(0, pos - width)
    head = "..." if start else ""
    tail = "..." if start + 2 * width < len(text) else ""
    return f'"{head}{text[start : start + 2 * width]}{tail}"'


def tokenize(text: str) -> list[Token]:
    """Split a filter into tokens ending with an EOF token, or raise FilterError."""
    tokens: list[Token] = []
    pos = _skip_space(text, 0)
    while pos < len(text):
        token = _next_token(text, pos, _operand_expected(tokens))
        tokens.append(token)
        pos = _skip_space(text, pos + len(token.text))
    tokens.append(Token("EOF", "", None, len(text)))
    return tokens


def _skip_space(text: str, pos: int) -> int:
    while pos < len(text) and text[pos].isspace():
        pos += 1
    return pos


def _operand_expected(tokens: list[Token]) -> bool:
    """True when the previous token leaves the parser waiting for an operand."""
    if not tokens:
        return True
    last = tokens[-1]
    if last.kind == "OP":
        return last.text != ")"
    return last.kind == "NAME" and last.text.upper() in OPERATOR_WORDS


def _next_token(text: str, pos: int, operand_expected: bool) -> Token:
    char = text[pos]
    if char == "/" and operand_expected:
        return _path(text, pos)
    if char in _STRINGS:
        return _string(text, pos, char)
    match = _NUMBER.match(text, pos)
    if match:
        return Token("NUM", match.group(), parse_number(match.group()), pos)
    match = _NAME.match(text, pos)
    if match:
        return Token("NAME", match.group(), match.group().upper(), pos)
    for op in _OPERATORS:
        if text.startswith(op, pos):
            return Token("OP", op, op, pos)
    raise error(text, pos, f"unexpected character {char!r}")


def _string(text: str, pos: int, quote: str) -> Token:
    match = _STRINGS[quote].match(text, pos)
    if not match:
        raise error(text, pos, "unterminated string literal")
    return Token("STR", match.group(), match.group(1).replace(quote * 2, quote), pos)


def _path(text: str, pos: int) -> Token:
    """A path token; its value is the tuple of steps (str field names, int indexes)."""
    steps: list[str | int] = []
    end = pos
    while match := _SEGMENT.match(text, end):
        steps.append(match.group(1))
        end = match.end()
        while index := _INDEX.match(text, end):
            steps.append(int(index.group(1)))
            end = index.end()
    if not steps:
        raise error(text, pos, "expected a field name after '/'")
    return Token("PATH", text[pos:end], tuple(steps), pos)
