"""Recursive-descent parser: filter text → syntax tree (see docs/filters.md for the grammar).

Precedence, loosest first: OR, AND, NOT, predicates (comparison, IS, BETWEEN, IN, LIKE,
BEGINS/ENDS WITH), ``+ -``, ``* / %``, unary minus, primaries.
"""

from __future__ import annotations

from functools import lru_cache
from typing import cast

from amps_on_kafka.errors import FilterError
from amps_on_kafka.expr import nodes as n
from amps_on_kafka.expr.functions import FUNCTIONS
from amps_on_kafka.expr.lexer import Token, describe, error, tokenize
from amps_on_kafka.expr.patterns import PatternError, program_size
from amps_on_kafka.expr.values import to_text

MAX_BYTES = 64 * 1024
#: Deepest nesting accepted, both of parser recursion and of the finished tree.  It keeps the
#: parser, the code generator and Python's own compiler far from their recursion limits.
MAX_DEPTH = 50
#: LIKE patterns in one filter, and the RE2 program size they may add up to. A filter is
#: compiled on the gateway's event loop and RE2 compiles holding the GIL: unbounded, 2,000
#: patterns of `(.{100}){10}` took 16 s and 430 MB, with every other session waiting.
MAX_PATTERNS = 64
MAX_PATTERN_PROGRAM = 10_000  # RE2 instructions, about 10 ms of compiling
#: Function calls in one filter. Their results are alive together (the arguments of CONCAT,
#: the items of IN), so this times functions.MAX_TEXT bounds one evaluation's memory.
MAX_CALLS = 100
#: Nodes that become code. Python's compile() of the generated function holds the GIL in one
#: call: 3,000 ORed equalities took 250 ms, while every other session waited; 500 nodes take
#: about 20 ms, and long lists of values belong in IN, whose literals are one constant.
MAX_NODES = 500

_COMPARE = {"=": "=", "==": "=", "!=": "!=", "<>": "!=", "<": "<", "<=": "<=", ">": ">", ">=": ">="}
_NEGATABLE = ("IN", "LIKE", "BETWEEN", "BEGINS", "ENDS")
_CONSTANTS = {"TRUE": True, "FALSE": False, "NULL": None}


def parse(text: object) -> n.Node:
    """Parse a whole filter or expression, raising FilterError for anything invalid."""
    if not isinstance(text, str):
        raise FilterError(f"a filter must be a string, not {type(text).__name__}")
    if len(text) > MAX_BYTES or len(text.encode("utf-8", "surrogatepass")) > MAX_BYTES:
        raise FilterError(f"filter is longer than {MAX_BYTES} bytes")
    return _Parser(text).parse()


@lru_cache(maxsize=256)
def parse_path(text: str) -> tuple[str | int, ...]:
    """The steps of a path such as ``/a/b[0]``, for callers that name key fields. Cached:
    a key look-up asks for its topic's Key paths each time (a parse was ~15 us of ~110)."""
    node = parse(text)
    if not isinstance(node, n.Path):
        raise FilterError(f"{text!r} is not a path such as /name or /a/b[0]")
    return node.steps


class _Parser:
    def __init__(self, text: str) -> None:
        self.text = text
        self.tokens = tokenize(text)
        self.index = 0
        self.nesting = 0
        self.patterns = 0
        self.program = 0  # RE2 instructions of the patterns so far
        self.calls = 0

    # -- token helpers ----------------------------------------------------------------------

    @property
    def tok(self) -> Token:
        return self.tokens[self.index]

    def advance(self) -> Token:
        token = self.tokens[self.index]
        self.index += 1
        return token

    def at_word(self, *words: str) -> bool:
        return self.tok.kind == "NAME" and self.tok.value in words

    def at_op(self, *ops: str) -> bool:
        return self.tok.kind == "OP" and self.tok.text in ops

    def fail(self, expected: str, token: Token | None = None) -> FilterError:
        token = token or self.tok
        return error(self.text, token.pos, f"expected {expected} but found {describe(token)}")

    def expect_op(self, op: str) -> Token:
        if not self.at_op(op):
            raise self.fail(repr(op))
        return self.advance()

    def expect_word(self, word: str) -> Token:
        if not self.at_word(word):
            raise self.fail(word)
        return self.advance()

    def enter(self) -> None:
        """Count one level of recursion; too deep is a FilterError, never a RecursionError."""
        self.nesting += 1
        if self.nesting > MAX_DEPTH:
            raise error(self.text, self.tok.pos, f"nested more than {MAX_DEPTH} levels deep")

    # -- grammar ----------------------------------------------------------------------------

    def parse(self) -> n.Node:
        if self.tok.kind == "EOF":
            raise self.fail("an expression")
        root = self.or_expr()
        if self.tok.kind != "EOF":
            raise self.fail("an operator or end of filter")
        levels, deepest = n.depth(root)
        if levels > MAX_DEPTH:
            raise error(self.text, deepest.pos, f"nested more than {MAX_DEPTH} levels deep")
        too_many = n.beyond(root, MAX_NODES)
        if too_many is not None:
            message = f"more than {MAX_NODES} operations (a long list of values fits in IN)"
            raise error(self.text, too_many.pos, message)
        return root

    def or_expr(self) -> n.Node:
        operands = [self.and_expr()]
        while self.at_word("OR"):
            self.advance()
            operands.append(self.and_expr())
        return _logical("OR", operands)

    def and_expr(self) -> n.Node:
        operands = [self.not_expr()]
        while self.at_word("AND"):
            self.advance()
            operands.append(self.not_expr())
        return _logical("AND", operands)

    def not_expr(self) -> n.Node:
        if not self.at_word("NOT"):
            return self.predicate()
        start = self.advance()
        self.enter()
        operand = self.not_expr()
        self.nesting -= 1
        return n.Not(start.pos, operand)

    def predicate(self) -> n.Node:
        left = self.additive()
        if self.tok.kind == "OP" and self.tok.text in _COMPARE:
            op = _COMPARE[self.advance().text]
            return n.Compare(left.pos, op, left, self.additive())
        if self.at_word("IS"):
            self.advance()
            negated = self.at_word("NOT")
            if negated:
                self.advance()
            self.expect_word("NULL")
            node: n.Node = n.IsNull(left.pos, left)
            return n.Not(left.pos, node) if negated else node
        negated = False
        if self.at_word("NOT") and self.tokens[self.index + 1].value in _NEGATABLE:
            self.advance()
            negated = True
        if not self.at_word(*_NEGATABLE):
            return left
        node = self.keyword_predicate(left)
        return n.Not(left.pos, node) if negated else node

    def keyword_predicate(self, left: n.Node) -> n.Node:
        word = self.advance().value
        if word == "BETWEEN":
            low = self.additive()
            self.expect_word("AND")
            return n.Between(left.pos, left, low, self.additive())
        if word == "IN":
            return n.In(left.pos, left, tuple(self.value_list()))
        if word == "LIKE":
            return n.Like(left.pos, left, self.pattern())
        self.expect_word("WITH")
        literals = self.literal_list()
        affixes = tuple(str(to_text(value)) for value in literals if value is not None)
        return n.Affix(left.pos, str(word), left, affixes, None in literals)

    def value_list(self) -> list[n.Node]:
        self.expect_op("(")
        items = [self.additive()]
        while self.at_op(","):
            self.advance()
            items.append(self.additive())
        self.expect_op(")")
        return items

    def literal_list(self) -> list[object]:
        self.expect_op("(")
        items = [self.literal()]
        while self.at_op(","):
            self.advance()
            items.append(self.literal())
        self.expect_op(")")
        return items

    def literal(self) -> object:
        start = self.tok
        node = self.unary()
        if not isinstance(node, n.Literal):
            raise self.fail("a literal", start)
        return node.value

    def pattern(self) -> str:
        token = self.tok
        if token.kind != "STR":
            raise self.fail("a string literal (LIKE patterns must be literals)")
        self.advance()
        pattern = str(token.value)
        self.patterns += 1
        if self.patterns > MAX_PATTERNS:
            raise error(self.text, token.pos, f"more than {MAX_PATTERNS} LIKE patterns")
        try:
            self.program += program_size(pattern)
        except PatternError as exc:
            raise error(self.text, token.pos, f"invalid LIKE pattern: {exc}") from None
        if self.program > MAX_PATTERN_PROGRAM:
            message = (
                f"the LIKE patterns are too large together ({self.program} RE2 instructions "
                f"so far, at most {MAX_PATTERN_PROGRAM} in one filter)"
            )
            raise error(self.text, token.pos, message)
        return pattern

    def additive(self) -> n.Node:
        left = self.multiplicative()
        while self.at_op("+", "-"):
            op = self.advance().text
            left = n.Arith(left.pos, op, left, self.multiplicative())
        return left

    def multiplicative(self) -> n.Node:
        left = self.unary()
        while self.at_op("*", "/", "%"):
            op = self.advance().text
            left = n.Arith(left.pos, op, left, self.unary())
        return left

    def unary(self) -> n.Node:
        if not self.at_op("-", "+"):
            return self.primary()
        sign = self.advance()
        self.enter()
        operand = self.unary()
        self.nesting -= 1
        if sign.text == "+":
            return operand
        value = operand.value if isinstance(operand, n.Literal) else None
        if isinstance(value, int | float) and not isinstance(value, bool):
            return n.Literal(sign.pos, -value)
        return n.Negate(sign.pos, operand)

    def primary(self) -> n.Node:
        token = self.tok
        if token.kind in ("NUM", "STR"):
            self.advance()
            value = None if token.value == "" else token.value  # the empty string is NULL
            return n.Literal(token.pos, cast(n.Scalar, value))
        if token.kind == "PATH":
            self.advance()
            return n.Path(token.pos, cast(tuple[str | int, ...], token.value))
        if self.at_op("("):
            self.advance()
            self.enter()
            inner = self.or_expr()
            self.nesting -= 1
            self.expect_op(")")
            return inner
        if token.kind == "NAME" and token.value in _CONSTANTS:
            self.advance()
            return n.Literal(token.pos, _CONSTANTS[str(token.value)])
        if token.kind == "NAME" and self.tokens[self.index + 1].text == "(":
            return self.call()
        raise self.fail("a value (a /path, a literal, a function call or '(')")

    def call(self) -> n.Node:
        name_token = self.advance()
        name = str(name_token.value)
        function = FUNCTIONS.get(name)
        if function is None:
            raise error(self.text, name_token.pos, f"unknown function {name_token.text!r}")
        self.calls += 1
        if self.calls > MAX_CALLS:
            raise error(self.text, name_token.pos, f"more than {MAX_CALLS} function calls")
        self.advance()
        self.enter()
        args = [] if self.at_op(")") else self.call_args()
        self.nesting -= 1
        self.expect_op(")")
        too_many = function.max_args is not None and len(args) > function.max_args
        if len(args) < function.min_args or too_many:
            message = f"{name} takes {function.arity()}, got {len(args)}"
            raise error(self.text, name_token.pos, message)
        return n.Call(name_token.pos, name, tuple(args))

    def call_args(self) -> list[n.Node]:
        args = [self.additive()]
        while self.at_op(","):
            self.advance()
            args.append(self.additive())
        return args


def _logical(op: str, operands: list[n.Node]) -> n.Node:
    return operands[0] if len(operands) == 1 else n.Logical(operands[0].pos, op, tuple(operands))
