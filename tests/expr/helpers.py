"""Shorthands for the expr tests."""

from __future__ import annotations

from amps_on_kafka.expr import compile_expression, compile_filter


def match(text: str, record: object) -> bool:
    """Does the filter match the record?"""
    return compile_filter(text).matches(record)


def value(text: str, record: object = None) -> object:
    """The value of an expression for the record."""
    return compile_expression(text).evaluate(record)


def unknown(condition: str, record: object) -> bool:
    """True when the condition is neither TRUE nor FALSE for the record (NULL involved)."""
    return not match(condition, record) and not match(f"NOT ({condition})", record)
