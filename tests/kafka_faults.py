"""Faults librdkafka raises on request, for tests: a producer's fatal error.

librdkafka's `rd_kafka_test_fatal_error` makes a producer act as if it had met a fatal
error (an idempotent producer that can no longer keep its guarantees): every later
produce fails, the records it queued are purged. The compiled producer exposes it
(RdProducer._test_fatal_error); confluent-kafka's does not, so its handle is read from
the Python object (confluent-kafka's `Handle`: the object header, then `rd_kafka_t *rk`)
and checked by its name before use.
"""

from __future__ import annotations

import ctypes
from typing import Any

from amps_on_kafka.log.native_producer import CompiledProducer
from amps_on_kafka.log.native_reader import loaded_library

INVALID_PRODUCER_EPOCH = 47  # what librdkafka reports when an epoch was fenced


def raise_fatal(producer: Any, reason: str = "test fault") -> None:
    """Make `producer` (compiled or confluent-kafka's) fail fatally now."""
    if isinstance(producer, CompiledProducer):
        assert producer.core._test_fatal_error(INVALID_PRODUCER_EPOCH, reason) == 0
        return
    library = ctypes.CDLL(loaded_library())
    library.rd_kafka_name.restype = ctypes.c_char_p
    library.rd_kafka_name.argtypes = [ctypes.c_void_p]
    library.rd_kafka_test_fatal_error.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_char_p]
    handle = ctypes.c_void_p.from_address(id(producer) + object.__basicsize__).value
    assert library.rd_kafka_name(handle).startswith(b"rdkafka#producer-"), "not a handle"
    code = library.rd_kafka_test_fatal_error(handle, INVALID_PRODUCER_EPOCH, reason.encode())
    assert code == 0
