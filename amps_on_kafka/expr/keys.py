"""A key look-up's filter, `/path = literal`, compiled without the lexer and the parser.

A gateway answers `sow` with `/id = 42` on its event loop (server/queries.py), and the
text is new each time (`/id = 43`, ...), so no cache of compiled filters helps. Tokenizing
and parsing it was about half of the gateway's CPU per look-up (docs/performance.md). A
text of this narrow shape (ASCII field names, a whole number of up to 18 digits or a
quoted text without quotes or control characters) has one tree, built here from the
match; tests/expr/test_keys.py holds it equal, positions included, to the parser's tree
for the same text, so the Filter compiled from it is the parser's (same generated code,
same `equalities`). Any other text is None: the caller compiles it as always.
"""

from __future__ import annotations

import re
from functools import lru_cache
from types import FunctionType

from amps_on_kafka.expr import codegen
from amps_on_kafka.expr import nodes as n
from amps_on_kafka.expr.compiler import Filter

_KEY_EQUALITY = re.compile(
    r"[ \t]*(?P<path>(?:/[A-Za-z_]\w{0,63}){1,8})[ \t]*=[ \t]*"
    r"(?:(?P<number>-?[0-9]{1,18})|'(?P<text>[^'\\\x00-\x1f\x7f]{1,200})')[ \t]*",
    re.ASCII,
)


def key_equality(text: str) -> n.Compare | None:
    """The parser's tree for `/path = literal`, or None for a text of any other shape."""
    match = _KEY_EQUALITY.fullmatch(text)
    if match is None:
        return None
    path = _path(match["path"], match.start("path"))
    number = match["number"]
    if number is not None:
        literal = n.Literal(pos=match.start("number"), value=int(number))
    else:
        literal = n.Literal(pos=match.start("text") - 1, value=match["text"])
    return n.Compare(pos=path.pos, op="=", left=path, right=literal)


@lru_cache(maxsize=256)
def _path(text: str, pos: int) -> n.Path:
    """A path's node, made once: a look-up's path is the same each time, its value not."""
    return n.Path(pos=pos, steps=tuple(text[1:].split("/")))


def compile_key_filter(text: str) -> Filter | None:
    """compile_filter(text) for a `/path = literal` text, else None. The code generated
    for a path and a kind of literal is made once (_shape) and given each text's literal
    as its global: generating it was most of what was left (~20 us -> ~3 us)."""
    tree = key_equality(text)
    if tree is None:
        return None
    literal = tree.right.value  # type: ignore[attr-defined]
    shape = _shape(tree.left.steps, type(literal))  # type: ignore[attr-defined,arg-type]
    if shape is None:
        return Filter(text, tree)
    run, name = shape
    namespace = dict(run.__globals__)
    namespace[name] = literal
    return Filter.built(text, tree, FunctionType(run.__code__, namespace, run.__name__))


@lru_cache(maxsize=256)
def _shape(steps: tuple[str, ...], kind: type) -> tuple[FunctionType, str] | None:
    """The function generated for `/steps = <a literal of kind>` and the name of the
    global holding its literal (a stand-in of that kind, found by identity), or None if
    that is not one plain global."""
    stand_in = int("987654321987654321") if kind is int else "".join(["\x00", "shape"])
    path = n.Path(pos=0, steps=steps)
    tree = n.Compare(pos=0, op="=", left=path, right=n.Literal(pos=0, value=stand_in))
    run = codegen.build(tree, as_filter=True)
    names = [name for name, value in run.__globals__.items() if value is stand_in]
    if len(names) != 1 or "_exact" in run.__globals__:
        return None
    return run, names[0]  # type: ignore[return-value]


class KeyEquality:
    """A `/path = literal` text as a key look-up on the gateway's event loop takes it
    (server/queries.py): the SOW key it pins and a `matches` of the compiled filter's
    answers, with no Filter built for the common record.

    Building the Filter (the match, its tree, the shape's function given the literal),
    then asking its tree which keys it pins, was ~10 us of a look-up's ~45 in-process
    (docs/performance.md). A record whose field holds a value of the literal's own type
    (an int for a number, a str for a text) is decided by `==`, the generated code's own
    first branch for it; any other value (a number in a text, a float, a list to lift
    over, no field) by the compiled filter, built then. tests/expr/test_keys.py holds
    `key` and `matches` to compile_filter's `equalities` and `matches`."""

    __slots__ = ("literal", "path", "steps", "text")

    def __init__(self, text: str, path: str, literal: int | str) -> None:
        self.text = text
        self.path = path  # as a Key path is written: `/a/b`
        self.steps = path[1:].split("/")
        self.literal = literal

    @classmethod
    def of(cls, text: object) -> KeyEquality | None:
        """The text's equality, or None for a text of any other shape (key_equality's)."""
        match = _KEY_EQUALITY.fullmatch(text) if type(text) is str else None
        if match is None:
            return None
        number = match["number"]
        literal = int(number) if number is not None else match["text"]
        return cls(text, match["path"], literal)  # type: ignore[arg-type]

    @property
    def key(self) -> str:
        """The SOW key the text pins on its path: key_from_values of its equalities."""
        literal = self.literal
        return literal if type(literal) is str else str(literal)

    def matches(self, data: object) -> bool:
        """compile_filter(self.text).matches(data)."""
        value = data
        for step in self.steps:
            value = value.get(step) if type(value) is dict else None
        if type(value) is type(self.literal):
            return value == self.literal
        return compile_key_filter(self.text).matches(data)  # type: ignore[union-attr]
