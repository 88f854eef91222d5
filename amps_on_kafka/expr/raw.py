"""A filter answered on a stored record's JSON bytes by the compiled core, when it can be.

A filtered scan decoded every stored record into a dict to filter it, the half it drops
included: the largest cost left in a gateway's scan (docs/performance.md, SOW queries).
For a narrow, common shape of filter — a path of object fields compared with a number
or a non-empty text, under AND, OR and NOT — `plan` gives what the compiled
`RawFilter` (native/src/filters.rs) evaluates while it parses the bytes. It answers
True or False as `Filter.matches` does on the decoded payload, or None when it is not
sure (then the caller decodes and filters that record as before). A filter of any other
shape has no plan, and without the core there is no raw filter: today's path.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from amps_on_kafka.expr import nodes as n
from amps_on_kafka.expr import values as v
from amps_on_kafka.expr.codegen import FLIPPED
from amps_on_kafka.expr.compiler import Filter
from amps_on_kafka.native import core

Plan = tuple[object, ...]
RawCheck = Callable[[bytes], bool | None]
# A plan is evaluated recursively (here and in Rust), and each object of its paths may
# name at most 64 fields (a bit each): a filter with more nodes than this has no plan.
MOST_NODES = 64
_SMALLEST, _LARGEST = -(2**63), 2**64  # the integers a plan carries: 64-bit


def raw_check(filter: Filter, skip: int) -> RawCheck | None:
    """The compiled check of `filter` on stored records whose payload starts at `skip`,
    or None (no core, or a filter of another shape)."""
    if core is None:
        return None
    shape = plan(filter.tree)
    return None if shape is None else core.RawFilter(shape, skip)


def plan(tree: n.Node) -> Plan | None:
    """The tree as the compiled filter takes it, or None when it has another shape."""
    if n.beyond(tree, MOST_NODES) is not None:
        return None
    return _plan(tree)


def _plan(node: n.Node) -> Plan | None:
    match node:
        case n.Logical(op=op, operands=operands):
            parts = [_plan(operand) for operand in operands]
            return None if None in parts else (op.lower(), tuple(parts))
        case n.Not(operand=operand):
            part = _plan(operand)
            return None if part is None else ("not", part)
        case n.Compare(op=op, left=left, right=right):
            if isinstance(left, n.Literal):
                op, left, right = FLIPPED[op], right, left
            return _comparison(op, left, right)
    return None


def _comparison(op: str, left: n.Node, right: n.Node) -> Plan | None:
    """("cmp", field names, op, literal, the literal text's number or None)."""
    if not isinstance(left, n.Path) or not isinstance(right, n.Literal):
        return None
    steps = left.steps
    if not all(isinstance(step, str) for step in steps) or not _carried(right.value):
        return None
    literal = right.value
    numeric = v.to_number(literal) if isinstance(literal, str) else None
    if numeric is not None and not _carried(numeric):
        return None
    return ("cmp", steps, op, literal, numeric)


def _carried(value: object) -> bool:
    """A literal the compiled filter holds exactly: a 64-bit integer, a finite float or
    a non-empty text ('' is NULL, a literal None; booleans are their own kind)."""
    if isinstance(value, bool) or value is None:
        return False
    if isinstance(value, int):
        return _SMALLEST <= value < _LARGEST
    return math.isfinite(value) if isinstance(value, float) else isinstance(value, str)
