"""The admin HTTP port of a worker (config `Admin: Listen:`).

    /metrics      Prometheus text (admin/metrics.py)
    /health       200 while the worker's loop runs (liveness), else 503
    /ready        200 once partitions are assigned, stores open, queues recovered, the
                  gateway serving and every partition within Admin.ReadyMaxLag; else 503
    /admin        the admin view as JSON (admin/view.py)
    /admin/rates  the last minutes, sampled each second (admin/rates.py)
    /             the live status page (admin/status.html)

A WSGI app (prometheus-client's own for /metrics) on the standard library's server, one
thread per request, all daemon threads: nothing here runs on the worker's loop or the
gateway's event loop, which it only reads from (view.py says how).

Bounds: at most `max_requests` (MAX_REQUESTS) requests are served at once, and at most
MAX_PER_ADDRESS of them from one client address, so one client holding idle connections
can't keep a load balancer's /health probe unanswered; a connection beyond either is
closed unanswered. A request must arrive within REQUEST_TIMEOUT, so a client that
connects and sends nothing holds its place no longer than that.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Iterable
from importlib.resources import files
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import make_wsgi_app

from amps_on_kafka.admin.metrics import registry
from amps_on_kafka.admin.rates import RateHistory
from amps_on_kafka.admin.view import Sources
from amps_on_kafka.config.model import AdminConfig
from amps_on_kafka.errors import TransportError

log = logging.getLogger(__name__)

Environ = dict[str, Any]
StartResponse = Callable[..., Any]
# Given a request's WSGI environ, True lets it through (auth.py's BasicAuth asks the
# gateway's Authentication). /health and /ready stay open for load balancers.
Authorize = Callable[[Environ], bool]
OPEN_PATHS = ("/health", "/ready")
MAX_REQUESTS = 16
MAX_PER_ADDRESS = 4
REQUEST_TIMEOUT = 10.0  # seconds


class _Server(ThreadingMixIn, WSGIServer):
    daemon_threads = True
    allow_reuse_address = True
    slots: threading.BoundedSemaphore  # requests served at once
    per_address: int  # of those, from one client address
    _held: dict[str, int]  # client address -> requests being served
    _held_lock: threading.Lock

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self._take(client_address[0]):
            log.debug("admin port: too many requests at once; closed one unanswered")
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._give_back(client_address[0])
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._give_back(client_address[0])

    def _take(self, address: str) -> bool:
        with self._held_lock:
            if self._held.get(address, 0) >= self.per_address:
                return False
            if not self.slots.acquire(blocking=False):
                return False
            self._held[address] = self._held.get(address, 0) + 1
            return True

    def _give_back(self, address: str) -> None:
        with self._held_lock:
            left = self._held.pop(address) - 1
            if left:
                self._held[address] = left
            self.slots.release()


class _QuietHandler(WSGIRequestHandler):
    """Requests go to the debug log, not stderr: Prometheus scrapes every few seconds."""

    timeout = REQUEST_TIMEOUT

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("admin %s: " + format, self.client_address[0], *args)


class AdminServer:
    def __init__(
        self,
        sources: Sources,
        settings: AdminConfig,
        *,
        authorize: Authorize | None = None,
        max_requests: int = MAX_REQUESTS,
        max_per_address: int = MAX_PER_ADDRESS,
    ) -> None:
        if settings.listen is None:
            raise ValueError("the admin port needs Admin: Listen: HOST:PORT")
        self.sources = sources
        self.settings = settings
        self.authorize = authorize
        self.max_requests = max_requests
        self.max_per_address = max_per_address
        self.history = RateHistory(sources.view)
        self._metrics = make_wsgi_app(registry(sources.view))
        self._page = files("amps_on_kafka.admin").joinpath("status.html").read_bytes()
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None
        self.address: str | None = None

    def start(self) -> str:
        """Bind and serve on a daemon thread; returns "host:port" bound (port 0 picks)."""
        host, _, port = self.settings.listen.rpartition(":")  # type: ignore[union-attr]
        try:
            self._server = make_server(
                host or "127.0.0.1", int(port), self, _Server, handler_class=_QuietHandler
            )
        except OSError as exc:
            reason = f"admin port can't listen on {self.settings.listen}: {exc}"
            raise TransportError(reason) from exc
        self._server.slots = threading.BoundedSemaphore(self.max_requests)
        self._server.per_address = self.max_per_address
        self._server._held, self._server._held_lock = {}, threading.Lock()
        bound = self._server.server_address
        self.address = f"{bound[0]}:{bound[1]}"
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="amps-admin", daemon=True
        )
        self._thread.start()
        self.history.start()
        log.info("admin port on http://%s/ (metrics at /metrics)", self.address)
        return self.address

    def stop(self) -> None:
        self.history.stop()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> AdminServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- the WSGI app --------------------------------------------------------------------
    def __call__(self, environ: Environ, start_response: StartResponse) -> Iterable[bytes]:
        path = environ.get("PATH_INFO") or "/"
        if path not in OPEN_PATHS and self.authorize is not None and not self.authorize(environ):
            challenge = [("WWW-Authenticate", 'Basic realm="amps-kafka admin"')]
            body = {"error": "authentication required: the gateway's users (HTTP Basic)"}
            return _json(start_response, "401 Unauthorized", body, challenge)
        try:
            return self._route(path, environ, start_response)
        except Exception as exc:  # a gateway stopping, a loop slow to answer: say so
            log.warning("admin %s failed: %s", path, exc)
            return _json(start_response, "503 Service Unavailable", {"error": str(exc)})

    def _route(self, path: str, environ: Environ, start_response: StartResponse) -> Iterable[bytes]:
        if path == "/metrics":
            return self._metrics(environ, start_response)
        if path == "/health":
            failed = self.sources.view()["worker"]["failed"]
            status = "503 Service Unavailable" if failed else "200 OK"
            return _json(start_response, status, {"alive": not failed, "failed": failed})
        if path == "/ready":
            view = self.sources.view()
            reasons = not_ready(view, self.settings.ready_max_lag, self.sources.gateway_expected)
            status = "503 Service Unavailable" if reasons else "200 OK"
            return _json(start_response, status, {"ready": not reasons, "reasons": reasons})
        if path == "/admin":
            return _json(start_response, "200 OK", self.sources.view())
        if path == "/admin/rates":
            points = {"every": self.history.every, "points": self.history.points()}
            return _json(start_response, "200 OK", points)
        if path in ("/", "/index.html"):
            start_response("200 OK", [("Content-Type", "text/html; charset=utf-8")])
            return [self._page]
        return _json(start_response, "404 Not Found", {"error": f"no page {path}"})


def not_ready(view: dict[str, Any], max_lag: int, gateway_expected: bool = True) -> list[str]:
    """Why the worker of this admin view should not get clients yet; empty when it should."""
    reasons = []
    worker = view["worker"]
    if worker["failed"]:
        reasons.append(f"worker failed: {worker['failed']}")
    if not worker["assigned"]:
        reasons.append("no partition assigned yet")
    elif view["sow_topics"] and not any(topic["partitions"] for topic in view["sow_topics"]):
        reasons.append("this worker owns no partition (no store open)")
    for topic in view["sow_topics"]:
        for part in topic["partitions"]:
            where = f"{topic['topic']}|{part['partition']}"
            if part["lag"] is None:
                reasons.append(f"{where}: log end not known yet")
            elif part["lag"] > max_lag:
                reasons.append(f"{where}: {part['lag']} records behind (ReadyMaxLag {max_lag})")
    for queue in view["queues"]:
        if queue["failed"] or not queue["ready"]:
            reasons.append(f"queue {queue['name']}: {queue['failed'] or 'recovering'}")
    if gateway_expected and view["gateway"] is None:
        reasons.append("the gateway is not serving yet")
    return reasons


def _json(
    start_response: StartResponse, status: str, body: Any, headers: Iterable = ()
) -> list[bytes]:
    data = json.dumps(body, default=str).encode()
    start_response(
        status,
        [("Content-Type", "application/json"), ("Cache-Control", "no-store"), *headers],
    )
    return [data]
