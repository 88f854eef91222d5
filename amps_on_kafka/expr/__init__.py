"""The AMPS filter language: compile once with ``compile_filter``, then ``matches`` records.

See docs/filters.md for the language reference.
"""

from amps_on_kafka.errors import FilterError
from amps_on_kafka.expr.compiler import Expression, Filter, compile_expression, compile_filter

__all__ = ["Expression", "Filter", "FilterError", "compile_expression", "compile_filter"]
