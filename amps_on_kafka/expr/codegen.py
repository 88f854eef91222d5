"""Turn a syntax tree into one Python function, compiled with ``compile()``.

Each predicate is emitted twice over: as a plain boolean expression "is TRUE" and one "is
FALSE", so three-valued AND/OR/NOT become Python's short-circuit ``and``/``or``/``not`` and a
filter is a single expression with no helper call on its hot path.  Fast paths inline the
common case (a field compared with a literal of the same type) behind a class check; every
other case calls the exact helpers in ``values``.  Literal values enter the source only as
named constants (None, True and False as themselves), never as text, so no filter can
inject code, and filters differing only in their values share one compiled code object.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import lru_cache
from types import CodeType
from typing import Any

from amps_on_kafka.errors import FilterError
from amps_on_kafka.expr import nodes as n
from amps_on_kafka.expr import values as v
from amps_on_kafka.expr.functions import FUNCTIONS
from amps_on_kafka.expr.patterns import compile_pattern

_PY_OPS = {"=": "==", "!=": "!=", "<": "<", "<=": "<=", ">": ">", ">=": ">="}
FLIPPED = {"=": "=", "!=": "!=", "<": ">", "<=": ">=", ">": "<", ">=": "<="}
Template = Callable[[str], str]
_INLINE_STEPS = 4
_CALLS = {name: function.bind() for name, function in FUNCTIONS.items()}


def _step(value: object, key: str) -> object:
    """A field of a dict subclass (plain dicts are handled inline)."""
    return value.get(key) if isinstance(value, dict) else None


def _index(value: object, index: int) -> object:
    """An element of a list subclass (plain lists are handled inline)."""
    return value[index] if isinstance(value, list) and len(value) > index else None


def _walk(record: dict, steps: tuple[str | int, ...]) -> object:
    """Follow a long path with a loop, keeping generated code shallow."""
    value: object = record
    for step in steps:
        value = _index(value, step) if isinstance(step, int) else _step(value, step)
    return value


_RUNTIME: dict[str, object] = {
    "_NUM": v.NUMBER_TYPES,
    "_EMPTY": {},
    "_step": _step,
    "_index": _index,
    "_walk": _walk,
    "_compare": v.compare,
    "_between": v.between,
    "_in": v.in_list,
    "_like": v.like,
    "_affix": v.affix,
    "_truth": v.truth,
    "_arith": v.arith,
    "_negate": v.negate,
    "_is_null": v.is_null,
    "_normalise": v.normalise,
}


def _is_number(value: object) -> bool:
    return value.__class__ in v.NUMBER_TYPES


class _Codegen:
    """Generates the source of one function; ``fast_arith`` inlines arithmetic on numbers."""

    def __init__(self, fast_arith: bool) -> None:
        self.namespace: dict[str, Any] = dict(_RUNTIME)
        self.fast_arith = fast_arith
        self.used_fast_arith = False
        self.uses_record = False
        self.temps = 0

    def const(self, value: object) -> str:
        """Source text for a constant: None, True and False as such, any other value a
        named global. Filters that differ only in their values (a look-up by key is a new
        filter text each time) then have the same source and share its compiled code."""
        if value is None or value is True or value is False:
            return repr(value)
        name = f"_k{len(self.namespace)}"
        self.namespace[name] = value
        return name

    def temp(self) -> str:
        self.temps += 1
        return f"_v{self.temps}"

    # -- values -----------------------------------------------------------------------------

    def value(self, node: n.Node) -> str:
        """Source of an expression yielding the node's raw value (arrays, '' not reduced)."""
        match node:
            case n.Literal(value=value):
                return self.const(value)
            case n.Path(steps=steps):
                return self.path(steps)
            case n.Negate(operand=operand):
                t = self.temp()
                guard = f"({t} := {self.value(operand)}).__class__ in _NUM"
                return f"(-{t} if {guard} else _negate({t}))"
            case n.Arith():
                return self.arith(node)
            case n.Call(name=name, args=args):
                func = self.const(_CALLS[name])
                return f"{func}({', '.join(self.value(arg) for arg in args)})"
        return f"(True if {self.true(node)} else False if {self.false(node)} else None)"

    def path(self, steps: tuple[str | int, ...]) -> str:
        """Inline field and index steps; the record itself is already known to be a dict."""
        self.uses_record = True
        if len(steps) > _INLINE_STEPS:
            return f"_walk(r, {self.const(steps)})"
        source = f"r.get({steps[0]!r})"
        for step in steps[1:]:
            t, key = self.temp(), repr(step)
            if isinstance(step, str):
                plain, fallback = f"{t}.get({key})", f"_step({t}, {key})"
                check = f"({t} := {source}).__class__ is dict"
            else:
                plain, fallback = f"{t}[{key}]", f"_index({t}, {key})"
                check = f"({t} := {source}).__class__ is list and len({t}) > {key}"
            source = f"({plain} if {check} else {fallback})"
        return source

    def arith(self, node: n.Arith) -> str:
        if not self.fast_arith:
            op = self.const(v.ARITH_OPS[node.op])
            return f"_arith({op}, {self.value(node.left)}, {self.value(node.right)})"
        fast, guard, exact = self.arith_parts(node)
        return f"({fast} if {guard} else {exact})"

    def arith_parts(self, node: n.Arith) -> tuple[str, str, str]:
        """Inlined arithmetic: (Python expression, guard that both are numbers, exact call)."""
        self.used_fast_arith = True
        op = self.const(v.ARITH_OPS[node.op])
        left, right = self.value(node.left), self.value(node.right)
        a, b = self.temp(), self.temp()
        guard = f"(({a} := {left}).__class__ in _NUM) & (({b} := {right}).__class__ in _NUM)"
        return f"{a} {node.op} {b}", guard, f"_arith({op}, {a}, {b})"

    # -- conditions -------------------------------------------------------------------------

    def true(self, node: n.Node) -> str:
        """Source of a Python bool: the node is TRUE."""
        return self.condition(node, True)

    def false(self, node: n.Node) -> str:
        """Source of a Python bool: the node is FALSE (not merely unknown)."""
        return self.condition(node, False)

    def condition(self, node: n.Node, want: bool) -> str:
        match node:
            case n.Literal(value=value):
                return repr(value is want)
            case n.Not(operand=operand):
                return self.condition(operand, not want)
            case n.Logical(op=op, operands=operands):
                joiner = " and " if (op == "AND") == want else " or "
                return "(" + joiner.join(self.condition(o, want) for o in operands) + ")"
            case n.IsNull(operand=operand):
                t = self.temp()
                test = f"(({t} := {self.value(operand)}) is None or _is_null({t}))"
                return test if want else f"not {test}"
            case n.Compare():
                return self.compare(node, want)
            case n.In():
                return self.in_list(node, want)
            case n.Between():
                return self.between(node, want)
            case n.Like():
                return self.like(node, want)
            case n.Affix():
                return self.affix(node, want)
        return f"(_truth({self.value(node)}) is {want})"

    def guarded(
        self, operand: n.Node, guard: str, fast: Template, slow: Template, want: bool
    ) -> str:
        """``fast`` when the operand's class is ``guard``, else the exact helper ``slow``.

        Templates are functions of the temporary holding the operand's value (never
        ``str.format``: literal text may contain braces).
        """
        t = self.temp()
        test = f"({t} := {self.value(operand)}).__class__ {guard}"
        return f"({fast(t)} if {test} else {slow(t)} is {want})"

    def compare(self, node: n.Compare, want: bool) -> str:
        op, left, right = node.op, node.left, node.right
        if isinstance(left, n.Literal) and isinstance(right, n.Literal):
            return repr(v.compare(v.COMPARE_OPS[op], left.value, right.value) is want)
        if isinstance(left, n.Literal):
            op, left, right = FLIPPED[op], right, left
        opfn = self.const(v.COMPARE_OPS[op])
        if not isinstance(right, n.Literal) or right.value is None:
            return f"(_compare({opfn}, {self.value(left)}, {self.value(right)}) is {want})"
        literal = right.value
        k, pyop, negation = self.const(literal), _PY_OPS[op], "" if want else "not "

        def slow(t: str) -> str:
            return f"_compare({opfn}, {t}, {k})"

        if _is_number(literal) and isinstance(left, n.Arith) and self.fast_arith:
            # Fused: the inlined arithmetic is known to give a number, so compare it directly.
            fast, guard, exact = self.arith_parts(left)
            return f"({negation}{fast} {pyop} {k} if {guard} else {slow(exact)} is {want})"
        if _is_number(literal):
            return self.guarded(left, "in _NUM", lambda t: f"{negation}{t} {pyop} {k}", slow, want)
        if literal.__class__ is str:
            # '' is NULL: exclude it wherever the plain comparison would give the wanted answer.
            null_guard = v.COMPARE_OPS[op]("", literal) is want

            def fast(t: str) -> str:
                test = f"{negation}{t} {pyop} {k}"
                return f"{t} != '' and {test}" if null_guard else test

            return self.guarded(left, "is str", fast, slow, want)
        return f"({slow(self.value(left))} is {want})"

    def in_list(self, node: n.In, want: bool) -> str:
        items = node.items
        literals = [item.value for item in items if isinstance(item, n.Literal)]
        if len(literals) < len(items):
            listed = "".join(f"{self.value(item)}, " for item in items)
            return f"(_in({self.value(node.operand)}, ({listed})) is {want})"
        listed = self.const(tuple(literals))

        def slow(t: str) -> str:
            return f"_in({t}, {listed})"

        members = self.const(frozenset(literals))
        if all(_is_number(item) for item in literals):

            def fast(t: str) -> str:
                return f"{t} in {members}" if want else f"{t} not in {members}"

            return self.guarded(node.operand, "in _NUM", fast, slow, want)
        if all(item.__class__ is str for item in literals):

            def fast_str(t: str) -> str:
                return f"{t} in {members}" if want else f"{t} != '' and {t} not in {members}"

            return self.guarded(node.operand, "is str", fast_str, slow, want)
        return f"({slow(self.value(node.operand))} is {want})"

    def between(self, node: n.Between, want: bool) -> str:
        low, high = self.value(node.low), self.value(node.high)

        def slow(t: str) -> str:
            return f"_between({t}, {low}, {high})"

        bounds = (node.low, node.high)
        if all(isinstance(b, n.Literal) and _is_number(b.value) for b in bounds):
            negation = "" if want else "not "

            def fast(t: str) -> str:
                return f"{negation}{low} <= {t} <= {high}"

            return self.guarded(node.operand, "in _NUM", fast, slow, want)
        return f"({slow(self.value(node.operand))} is {want})"

    def like(self, node: n.Like, want: bool) -> str:
        if not node.pattern:
            return "False"  # LIKE NULL is unknown for every value
        search = self.const(compile_pattern(node.pattern))
        test = "" if want else "not "
        return self.guarded(
            node.operand,
            "is str",
            lambda t: f"{t} != '' and {test}{search}({t})",
            lambda t: f"_like({search}, {t})",
            want,
        )

    def affix(self, node: n.Affix, want: bool) -> str:
        affixes = self.const(node.affixes)

        def slow(t: str) -> str:
            return f"_affix({node.kind!r}, {affixes}, {node.has_null}, {t})"

        if node.has_null:
            return f"({slow(self.value(node.operand))} is {want})"
        method = "startswith" if node.kind == "BEGINS" else "endswith"

        def fast(t: str) -> str:
            test = f"{t}.{method}({affixes})"
            return test if want else f"{t} != '' and not {test}"

        return self.guarded(node.operand, "is str", fast, slow, want)


def generate(root: n.Node, as_filter: bool, fast_arith: bool = True) -> tuple[str, dict]:
    """The source of ``_run(r)`` and the globals it needs (print it to see what runs)."""
    gen = _Codegen(fast_arith)
    body = gen.true(root) if as_filter else f"_normalise({gen.value(root)})"
    lines = ["def _run(r):"]
    if gen.uses_record:
        lines.append("    if r.__class__ is not dict:")
        lines.append("        r = r if isinstance(r, dict) else _EMPTY")
    if gen.used_fast_arith:
        lines += ["    try:", f"        return {body}", "    except ArithmeticError:"]
        lines.append("        return _exact(r)")
        _, gen.namespace["_exact"] = _build(root, as_filter, fast_arith=False)
    else:
        lines.append(f"    return {body}")
    return "\n".join(lines) + "\n", gen.namespace


def _build(root: n.Node, as_filter: bool, fast_arith: bool) -> tuple[str, Callable[[Any], Any]]:
    """Compile the generated source; Python's own limits surface as a FilterError."""
    source, namespace = generate(root, as_filter, fast_arith)
    try:
        code = _compiled(source)
    except (SyntaxError, RecursionError, MemoryError, ValueError) as exc:
        raise FilterError(f"filter is too complex to compile: {exc}") from None
    exec(code, namespace)
    return source, namespace["_run"]


@lru_cache(maxsize=1024)
def _compiled(source: str) -> CodeType:
    """compile() is most of the cost of a new filter (about 0.3 ms of a key look-up's
    filter: docs/performance.md); sources hold no values (const), so one code object
    serves every filter of the same shape."""
    return compile(source, "<filter>", "exec")


def build(root: n.Node, as_filter: bool, fast_arith: bool = True) -> Callable[[Any], Any]:
    """Compile a tree into a function of one record (a filter's returns a bool).

    ``fast_arith=False`` gives the exact variant the fast one falls back to on an arithmetic
    exception; production always starts from the fast one.
    """
    return _build(root, as_filter, fast_arith)[1]
