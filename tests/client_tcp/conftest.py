"""The gateway fixtures of tests/server, for the client's tcp:// transport tests."""

from tests.server.conftest import bare_gateway, client_to, served

__all__ = ["bare_gateway", "client_to", "served"]
