"""The syntax tree the parser produces and both the compiler and the test oracle walk.

Negated keyword forms (``NOT IN``, ``NOT LIKE``, ``NOT BETWEEN``, ``IS NOT NULL``,
``NOT BEGINS WITH``, ``NOT ENDS WITH``) are ``Not`` around the positive node, exactly as SQL
defines them, so no node carries a ``negated`` flag.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, fields

Scalar = int | float | str | bool | None


@dataclass(frozen=True, slots=True)
class Node:
    """Base class; ``pos`` is the 0-based offset of the node's first token."""

    pos: int


@dataclass(frozen=True, slots=True)
class Literal(Node):
    """A constant; the empty string literal is stored as ``None`` (it is NULL)."""

    value: Scalar


@dataclass(frozen=True, slots=True)
class Path(Node):
    """``/a/b[0]``: steps are field names (str) and array indexes (int)."""

    steps: tuple[str | int, ...]


@dataclass(frozen=True, slots=True)
class Negate(Node):
    """Unary minus on a non-literal operand."""

    operand: Node


@dataclass(frozen=True, slots=True)
class Arith(Node):
    """Binary arithmetic; op is one of ``+ - * / %``."""

    op: str
    left: Node
    right: Node


@dataclass(frozen=True, slots=True)
class Compare(Node):
    """Comparison; op is normalised to one of ``= != < <= > >=``."""

    op: str
    left: Node
    right: Node


@dataclass(frozen=True, slots=True)
class Logical(Node):
    """An n-ary AND or OR; chains are flat so long OR lists do not nest."""

    op: str
    operands: tuple[Node, ...]


@dataclass(frozen=True, slots=True)
class Not(Node):
    operand: Node


@dataclass(frozen=True, slots=True)
class IsNull(Node):
    operand: Node


@dataclass(frozen=True, slots=True)
class Between(Node):
    operand: Node
    low: Node
    high: Node


@dataclass(frozen=True, slots=True)
class In(Node):
    operand: Node
    items: tuple[Node, ...]


@dataclass(frozen=True, slots=True)
class Like(Node):
    """``LIKE 'regex'``; the pattern is always a literal, so it is kept as text."""

    operand: Node
    pattern: str


@dataclass(frozen=True, slots=True)
class Affix(Node):
    """``BEGINS WITH (...)`` (kind ``BEGINS``) or ``ENDS WITH (...)`` (kind ``ENDS``).

    ``affixes`` are the texts of the non-NULL literals; ``has_null`` records a NULL literal,
    which makes a non-match unknown instead of false, as in ``IN``.
    """

    kind: str
    operand: Node
    affixes: tuple[str, ...]
    has_null: bool


@dataclass(frozen=True, slots=True)
class Call(Node):
    """A function call; ``name`` is upper-case and known to the function table."""

    name: str
    args: tuple[Node, ...]


def children(node: Node) -> Iterator[Node]:
    """The direct sub-nodes of any node, in source order."""
    for field in fields(node):
        value = getattr(node, field.name)
        if isinstance(value, Node):
            yield value
        elif isinstance(value, tuple):
            yield from (item for item in value if isinstance(item, Node))


def beyond(root: Node, limit: int) -> Node | None:
    """The node at which a walk in source order has counted more than `limit` nodes that
    become code, or None. The literal items of an IN are one constant and do not count."""
    count, stack = 0, [root]
    while stack:
        node = stack.pop()
        count += 1
        if count > limit:
            return node
        coded = (node.operand,) if _literal_in(node) else tuple(children(node))  # type: ignore[attr-defined]
        stack.extend(reversed(coded))
    return None


def _literal_in(node: Node) -> bool:
    return isinstance(node, In) and all(isinstance(item, Literal) for item in node.items)


def depth(root: Node) -> tuple[int, Node]:
    """The tree's depth and its deepest node, computed without recursion."""
    deepest, best = 1, root
    stack = [(root, 1)]
    while stack:
        node, level = stack.pop()
        if level > deepest:
            deepest, best = level, node
        stack.extend((child, level + 1) for child in children(node))
    return deepest, best
