"""Key analysis: which key values can a filter possibly match?

The SOW uses this to turn a filter into direct key look-ups instead of a scan.  The answer is
a superset: every record the filter matches has its key among the returned tuples, but not
every record found that way matches, so callers must still run ``Filter.matches``.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence

from amps_on_kafka.expr import nodes as n
from amps_on_kafka.expr.parser import parse_path

#: Beyond this many key combinations a look-up is no cheaper than a scan.
MAX_KEYS = 10_000

Steps = tuple[str | int, ...]


def equalities(root: n.Node, paths: Sequence[str]) -> list[tuple] | None:
    """The key tuples ``root`` pins for ``paths``, or None when some key is not pinned."""
    per_key: list[list[object]] = []
    for path in paths:
        values = _pinned(root, parse_path(path))
        if values is None:
            return None
        per_key.append(values)
    if not per_key or math.prod(len(values) for values in per_key) > MAX_KEYS:
        return None
    return list(itertools.product(*per_key))


def _pinned(node: n.Node, steps: Steps) -> list[object] | None:
    """Values ``node`` restricts the field at ``steps`` to, or None if it does not.

    An AND is pinned by any of its conjuncts, an OR only when every branch pins the field.
    NULL literals are dropped: an equality with NULL never matches.
    """
    match node:
        case n.Compare(op="=", left=n.Path(steps=s), right=n.Literal(value=value)) if s == steps:
            return _distinct([value])
        case n.Compare(op="=", left=n.Literal(value=value), right=n.Path(steps=s)) if s == steps:
            return _distinct([value])
        case n.In(operand=n.Path(steps=s), items=items) if s == steps:
            literals = [item.value for item in items if isinstance(item, n.Literal)]
            return _distinct(literals) if len(literals) == len(items) else None
        case n.Logical(op="AND", operands=operands):
            return next((found for o in operands if (found := _pinned(o, steps)) is not None), None)
        case n.Logical(op="OR", operands=operands):
            values: list[object] = []
            for operand in operands:
                branch = _pinned(operand, steps)
                if branch is None:
                    return None
                values += branch
            return _distinct(values)
    return None


def _distinct(values: Sequence[object]) -> list[object]:
    """Drop NULLs and repeats, keeping order; 1, 1.0 and True stay distinct keys."""
    seen: set[tuple[type, object]] = set()
    result = []
    for value in values:
        key = (value.__class__, value)
        if value is not None and key not in seen:
            seen.add(key)
            result.append(value)
    return result
