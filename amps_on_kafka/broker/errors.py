"""The one error type of the broker sub-package."""

from __future__ import annotations

from amps_on_kafka.errors import AmpsError


class BrokerError(AmpsError, RuntimeError):
    """The local Kafka broker could not be fetched, started, reached or stopped.

    The message says what went wrong and, where the broker itself failed, ends with the
    tail of its log, so a CLI user or a test report sees the cause without digging.
    """
