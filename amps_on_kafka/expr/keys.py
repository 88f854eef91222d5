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
    path = n.Path(pos=match.start("path"), steps=tuple(match["path"][1:].split("/")))
    number = match["number"]
    if number is not None:
        literal = n.Literal(pos=match.start("number"), value=int(number))
    else:
        literal = n.Literal(pos=match.start("text") - 1, value=match["text"])
    return n.Compare(pos=path.pos, op="=", left=path, right=literal)


def compile_key_filter(text: str) -> Filter | None:
    """compile_filter(text) for a `/path = literal` text, else None."""
    tree = key_equality(text)
    return None if tree is None else Filter(text, tree)
