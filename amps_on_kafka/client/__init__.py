"""The adapter client: `Client` and the message streams it returns."""

from amps_on_kafka.client.client import Client
from amps_on_kafka.client.stream import MessageStream

__all__ = ["Client", "MessageStream"]
