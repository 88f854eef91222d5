"""The worker's admin port: Prometheus metrics, health and readiness, the admin view in
JSON, and a live status page (docs/operations.md, Metrics and admin).

Above processor/ and server/, which it reads and which know nothing of it: they count in
plain ints, and this package turns the counts into views when asked.
"""

from amps_on_kafka.admin.auth import BasicAuth
from amps_on_kafka.admin.server import AdminServer, not_ready
from amps_on_kafka.admin.view import Sources

__all__ = ["AdminServer", "BasicAuth", "Sources", "not_ready"]
