"""LIKE patterns, matched by RE2 in time linear in the text.

A LIKE pattern comes from whoever sends a filter. Python's backtracking `re` takes
exponential time on patterns such as `(a+)+$` and holds the GIL all the while, so one
query froze every session of a worker. RE2 guarantees linear time; the price is the
constructs that need backtracking (backreferences, lookaround, possessive quantifiers,
atomic groups), which are refused when the filter is compiled.

RE2 is called through its extension type rather than the `re2` module's `search`: that
wrapper builds match objects and offset maps, eight times the cost of the match itself.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import lru_cache

import re2
from re2 import _re2

_UNANCHORED = _re2.RE2.Anchor.UNANCHORED
#: RE2's memory budget for the check compile. RE2's compile time grows with the program and
#: holds the GIL: at 8 MiB `\pL{300}` took 0.3 s; at 1 MiB the largest program compiles in
#: about 30 ms and a pattern past the budget is refused in about 12 ms.
CHECK_BYTES = 1 << 20
#: The largest program (RE2 instructions) of one pattern. RE2 is linear in the text only
#: while its DFA's states fit its memory; past that it falls back to an NFA that steps every
#: live instruction for every byte: `.{1000}x` took 12 s on 300,000 characters at 8 MiB.
#: Up to this size, 8 MiB has held every pattern tried to about 10 ms a megabyte.
MAX_PROGRAM = 2_500
#: RE2's memory budget for matching (its default): program, then DFA states as they come.
MATCH_BYTES = 8 << 20

# What RE2's error says, and what to tell the user instead.
_UNSUPPORTED = (
    ("invalid perl operator: (?=", "lookahead (?=...)"),
    ("invalid perl operator: (?!", "negative lookahead (?!...)"),
    ("invalid perl operator: (?<=", "lookbehind (?<=...)"),
    ("invalid perl operator: (?<!", "negative lookbehind (?<!...)"),
    ("invalid perl operator: (?>", "atomic groups (?>...)"),
    ("bad repetition operator: *+", "possessive quantifiers"),
    ("bad repetition operator: ++", "possessive quantifiers"),
    ("bad repetition operator: ?+", "possessive quantifiers"),
    ("invalid escape sequence: \\Z", "\\Z (use $ or \\z)"),
)


class PatternError(ValueError):
    """A LIKE pattern RE2 cannot compile; the message names what is wrong."""


def _options(max_mem: int) -> re2.Options:
    options = re2.Options()
    options.log_errors = False  # RE2 would print each refused pattern to stderr
    options.never_capture = True  # LIKE asks only whether there is a match
    options.max_mem = max_mem
    return options


_CHECK = _options(CHECK_BYTES)
_MATCH = _options(MATCH_BYTES)


def compile_pattern(pattern: str) -> Callable[[str], bool]:
    """A function telling whether `pattern` matches somewhere in a text (re.search's
    semantics, RE2's syntax). Raises PatternError naming what RE2 does not support."""
    match = _compiled(pattern).Match

    def matches(text: str) -> bool:
        encoded = text.encode(errors="surrogatepass")
        return match(_UNANCHORED, encoded, 0, len(encoded))[0][0] >= 0

    return matches


def program_size(pattern: str) -> int:
    """The size of `pattern`'s RE2 program (its instruction count), which its compile time
    and memory follow; a filter's patterns share a budget of these. Raises PatternError."""
    return int(_compiled(pattern).ProgramSize())


@lru_cache(maxsize=64)
def _compiled(pattern: str) -> _re2.RE2:
    """One compile per pattern for the parser's check and the generated code alike (RE2
    objects are safe to share between threads). Kept small: each may grow its DFA to
    MATCH_BYTES, and the compiled filters hold the patterns they use anyway."""
    encoded = pattern.encode(errors="surrogatepass")
    check = _re2.RE2(encoded, _CHECK)
    if not check.ok():
        raise PatternError(_explain(check.error()))
    if check.ProgramSize() > MAX_PROGRAM:
        raise PatternError(
            f"pattern too large: {check.ProgramSize()} RE2 instructions, at most {MAX_PROGRAM} "
            "(counted repeats such as .{300} and Unicode classes such as \\pL are large, "
            "[a-z] is small)"
        )
    return _re2.RE2(encoded, _MATCH)


def _explain(error: str | bytes) -> str:
    reason = error.decode(errors="replace") if isinstance(error, bytes) else error
    feature = next((feature for said, feature in _UNSUPPORTED if said in reason), None)
    if feature is None and reason.startswith("invalid escape sequence: \\"):
        feature = "backreferences" if reason[-1:].isdigit() else None
    if feature is None:
        return reason
    return f"{feature} not supported (LIKE uses RE2 syntax, which matches in linear time): {reason}"
