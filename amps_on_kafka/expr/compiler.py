"""Public entry points: compile filter text once, then evaluate it against many records."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import lru_cache
from typing import Any, TypeVar

from amps_on_kafka.errors import FilterError
from amps_on_kafka.expr import analysis, codegen, nodes
from amps_on_kafka.expr.parser import parse


class Filter:
    """A compiled filter.

    ``matches(record) -> bool`` is the generated function itself (an instance attribute, so
    no bound-method hop on the hot path).  It is True only when the filter is TRUE for the
    record; FALSE and unknown (NULL involved) both do not match.  A record that is not a dict
    has no fields: every path in it is NULL.
    """

    __slots__ = ("matches", "text", "tree")

    matches: Callable[[Any], bool]

    def __init__(self, text: str, tree: nodes.Node) -> None:
        self.text = text
        self.tree = tree
        self.matches = codegen.build(tree, as_filter=True)

    @classmethod
    def built(cls, text: str, tree: nodes.Node, matches: Callable[[Any], bool]) -> Filter:
        """The Filter of `tree` with its function built already: what __init__ makes,
        without generating the code (expr/keys.py gives a cached shape's function its
        own literal)."""
        made = cls.__new__(cls)
        made.text, made.tree, made.matches = text, tree, matches
        return made

    def equalities(self, paths: Sequence[str]) -> list[tuple] | None:
        """Key tuples for ``paths`` that the filter pins by equality, else None.

        ``/id = 42`` gives ``[(42,)]``, ``/id IN (1, 2)`` gives ``[(1,), (2,)]``; any other
        conditions ANDed on are ignored, so the caller must still run ``matches`` on each
        record it looks up.  Values are the literals as written (42 stays an int).
        """
        return analysis.equalities(self.tree, paths)

    def __repr__(self) -> str:
        return f"Filter({self.text!r})"


class Expression:
    """A compiled value expression (priority, order-by key, barrier).

    ``evaluate(record)`` returns the value, or None when it is NULL; conditions evaluate to
    True, False or None (unknown).
    """

    __slots__ = ("evaluate", "text", "tree")

    evaluate: Callable[[Any], Any]

    def __init__(self, text: str, tree: nodes.Node) -> None:
        self.text = text
        self.tree = tree
        self.evaluate = codegen.build(tree, as_filter=False)

    def __repr__(self) -> str:
        return f"Expression({self.text!r})"


_Compiled = TypeVar("_Compiled", Filter, Expression)


def compile_filter(text: str) -> Filter:
    """Compile filter text; raises FilterError (and nothing else) when it is invalid."""
    if not isinstance(text, str):
        raise FilterError(f"a filter must be a string, not {type(text).__name__}")
    return _cached_filter(text)


def compile_expression(text: str) -> Expression:
    """Compile a value expression; raises FilterError (and nothing else) when it is invalid."""
    if not isinstance(text, str):
        raise FilterError(f"an expression must be a string, not {type(text).__name__}")
    return _cached_expression(text)


@lru_cache(maxsize=1024)
def _cached_filter(text: str) -> Filter:
    """Many subscriptions share a filter text; compiled filters are immutable, so share them."""
    return _build(Filter, text)


@lru_cache(maxsize=1024)
def _cached_expression(text: str) -> Expression:
    return _build(Expression, text)


def _build(cls: type[_Compiled], text: str) -> _Compiled:
    """Parse and compile; a stack already deep in the caller's recursion is a FilterError too."""
    try:
        return cls(text, parse(text))
    except RecursionError:
        raise FilterError("filter is nested too deeply for the available stack") from None
