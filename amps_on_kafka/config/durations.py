"""AMPS durations (`500ms`, `30s`, `5m`, `1h`, `1d`) as seconds.

AMPS configuration writes every interval with a unit suffix; a bare number is taken as
seconds, which is what AMPS does for expiration headers on messages.
"""

from __future__ import annotations

import re

_UNITS = {
    "ns": 1e-9,
    "us": 1e-6,
    "ms": 1e-3,
    "s": 1.0,
    "m": 60.0,
    "h": 3600.0,
    "d": 86400.0,
    "w": 604800.0,
}
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ns|us|ms|s|m|h|d|w)?\s*$", re.IGNORECASE)


def parse_duration(text: str | float | int) -> float:
    """Seconds in an AMPS duration; raises ValueError naming the text when it is not one."""
    if isinstance(text, bool):
        raise ValueError(f"not a duration: {text!r}")
    if isinstance(text, int | float):
        if text < 0:
            raise ValueError(f"a duration can't be negative: {text!r}")
        return float(text)
    match = _DURATION.match(str(text))
    if not match:
        raise ValueError(
            f"not a duration: {text!r} (expected a number with a unit: ms, s, m, h, d, w)"
        )
    number, unit = match.groups()
    return float(number) * _UNITS[(unit or "s").lower()]
