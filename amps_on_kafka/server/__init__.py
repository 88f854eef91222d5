"""The gateway: an AMPS-style command protocol over TCP, served inside each worker."""

from amps_on_kafka.server.gateway import Gateway

__all__ = ["Gateway"]
