"""The gateway: the worker's AMPS-style command protocol over TCP (docs/protocol.md).

It runs an asyncio loop on a daemon thread of its own, so the worker (and tests) start
it and go on: `start()` returns the address bound. Blocking work — RocksDB queries,
Kafka metadata look-ups, opening replays — goes to a small thread pool; Kafka delivery
reports are served by the DeliveryPump thread; each log subscription has its replay
thread. The loop itself only moves frames.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import ssl
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import suppress
from functools import partial
from typing import Any, TypeVar

from confluent_kafka import Producer

from amps_on_kafka.config.model import GatewayConfig
from amps_on_kafka.errors import TransportError
from amps_on_kafka.log.kafka import ProducerLog, client_config, log_producer_config
from amps_on_kafka.log.native_producer import CompiledProducer, native_producer
from amps_on_kafka.log.registry import TopicRegistry
from amps_on_kafka.processor.engine import SowEngine
from amps_on_kafka.processor.queues import QueueEngine
from amps_on_kafka.protocol.frames import READ_SIZE, encode_frame
from amps_on_kafka.security.auth import Credentials, Identity, LogonFailed, Throttled, audit
from amps_on_kafka.security.entitlements import Denied
from amps_on_kafka.security.policy import PeerAccess, Security
from amps_on_kafka.security.tls import server_context
from amps_on_kafka.security.users import PEER_USER
from amps_on_kafka.server.buffers import SendBudget
from amps_on_kafka.server.cluster import Cluster
from amps_on_kafka.server.deletes import DeleteTracker
from amps_on_kafka.server.delivery import DeliveryPump, PublishBudget
from amps_on_kafka.server.fanout import Fanout
from amps_on_kafka.server.queries import KeyPlan
from amps_on_kafka.server.queues import QueueService
from amps_on_kafka.server.replies import ack
from amps_on_kafka.server.session import Session
from amps_on_kafka.server.stats import GatewayStats

log = logging.getLogger(__name__)

START_TIMEOUT = 10.0
KEEPALIVE_IDLE = 60  # seconds of silence before the first probe
KEEPALIVE_INTERVAL = 10  # seconds between probes
KEEPALIVE_PROBES = 6  # unanswered probes before the kernel resets the connection
T = TypeVar("T")


class Gateway:
    def __init__(
        self,
        engine: SowEngine,
        bootstrap: str,
        *,
        listen: str = "127.0.0.1:9007",
        settings: GatewayConfig | None = None,
        registry: TopicRegistry | None = None,
        queues: QueueEngine | None = None,
        security: Security | None = None,
    ) -> None:
        """`settings` are the config's Gateway section (its Listen is the `listen` here);
        `security` its Authentication and Entitlements (Security.from_config): without
        one, anyone may log on anonymously and do anything."""
        self.engine = engine
        self.bootstrap = bootstrap
        self.listen = listen
        self.settings = settings = settings or GatewayConfig()
        self.max_frame_bytes = settings.max_frame_bytes
        self.max_queued_bytes = settings.max_queued_bytes
        self.registry = registry or TopicRegistry(bootstrap)
        self.address: str | None = None
        self.loop = new_loop(tls=settings.tls is not None)
        self.deletes = DeleteTracker()
        self.stats = GatewayStats()  # counted on the loop, read by the admin port
        self.fanout = Fanout(engine, self.loop, self.deletes, self.blocking)
        self.buffers = SendBudget(settings.max_buffered_bytes, self.sessions)
        # Set by a worker in a group (cli/worker.py): queries span every worker's partitions.
        self.cluster: Cluster | None = None
        # a look-up's checks, made once per (topic, acks, bs) shape (queries.look_up_at_once)
        self.key_plans: dict[tuple[str, str | None, int | None], KeyPlan] = {}
        self.producer = _shared_producer(bootstrap, settings)
        self.pump = DeliveryPump(
            self.loop,
            self.producer,
            settings.publish_timeout,
            renew=partial(_shared_producer, bootstrap, settings),
            adopt=self._adopt_producer,
        )
        self._producer_closed = False
        self.budget = PublishBudget(
            settings.max_publish_bytes_in_flight, settings.max_publishes_in_flight
        )
        self.queues = QueueService(queues, self.loop) if queues is not None else None
        self._executor = ThreadPoolExecutor(max_workers=4, thread_name_prefix="amps-gateway-work")
        self.security = security or Security.open()
        # Password hashes (argon2: 64 MiB, tens of ms each) are verified here, two at a
        # time: a flood of logons takes neither the loop nor the threads queries run on.
        self._auth_pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="amps-gateway-auth")
        self.peer_access = PeerAccess.of(settings.tls, self.security.peer_secret)
        self._thread = threading.Thread(
            target=self.loop.run_forever, name="amps-gateway", daemon=True
        )
        self._server: asyncio.Server | None = None
        self._tls: ssl.SSLContext | None = None  # Gateway.TLS's, once started
        self._handshakes = 0  # TLS handshakes in progress (connections not yet sessions)
        self._sessions: set[Session] = set()
        self._names: dict[str, Session] = {}
        self._threads: list[threading.Thread] = []

    # -- lifecycle (any thread) -----------------------------------------------------------
    def start(self) -> str:
        """Bind and serve; returns "host:port" actually bound (port 0 picks a free one)."""
        host, _, port = self.listen.rpartition(":")
        tls = self.settings.tls
        context = server_context(tls) if tls is not None else None  # ConfigError first
        self._thread.start()
        self.pump.start()
        self.engine.add_listener(self.fanout.listener)
        self._tls = context
        try:
            self._server = asyncio.run_coroutine_threadsafe(
                asyncio.start_server(self._accept, host or "127.0.0.1", int(port)),
                self.loop,
            ).result(START_TIMEOUT)
        except OSError as exc:
            self.stop()
            raise TransportError(f"gateway can't listen on {self.listen}: {exc}") from exc
        bound = self._server.sockets[0].getsockname()
        self.address = f"{bound[0]}:{bound[1]}"
        log.info("gateway listening on %s%s", self.address, " (TLS)" if context else "")
        return self.address

    def stop(self, timeout: float = 10.0) -> None:
        """Close every connection and subscription, then the loop; idempotent."""
        self.engine.remove_listener(self.fanout.listener)
        if self._thread.is_alive():
            with suppress(TimeoutError):
                asyncio.run_coroutine_threadsafe(self._shutdown(), self.loop).result(timeout)
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(timeout)
        if not self.loop.is_closed() and not self.loop.is_running():
            self.loop.close()
        for thread in self._threads:
            thread.join(timeout)
        self.pump.stop()
        self._executor.shutdown(wait=True)
        self._auth_pool.shutdown(wait=True)
        self._close_producer(timeout)

    def __enter__(self) -> Gateway:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    async def _shutdown(self) -> None:
        if self._server is not None:
            self._server.close()
        self.fanout.stop()
        for session in list(self._sessions):
            session.close()

    def _close_producer(self, timeout: float) -> None:
        """What the sessions published still goes to Kafka, within `timeout`; then the
        producer's threads and connections go now, not whenever the GC frees it."""
        if self._producer_closed:
            return
        self._producer_closed = True
        unsent = self.producer.flush(timeout)
        if unsent:
            log.warning("gateway stopped with %d publish(es) Kafka had not acknowledged", unsent)
        self.producer.close()

    def _adopt_producer(self, producer: Producer | CompiledProducer) -> None:
        """(On the loop.) The producer that replaced one that failed fatally
        (DeliveryPump._replace) takes every session's next write."""
        self.producer = producer
        for session in self._sessions:
            session.use_producer(producer)
        self.stats.producer_replacements += 1

    @property
    def session_count(self) -> int:
        """Connections open now (logged on or not)."""
        return len(self._sessions)

    # -- the event loop -----------------------------------------------------------------
    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        # asyncio's transport reads max_size bytes per recv (256 KiB): see READ_SIZE for why
        # not that. uvloop's has no such field: it reads into one buffer its loop keeps and
        # copies out only the bytes read, so no large buffer is mapped per read.
        if hasattr(writer.transport, "max_size"):
            writer.transport.max_size = READ_SIZE
        keep_alive(writer.get_extra_info("socket"))
        if len(self._sessions) + self._handshakes >= self.settings.max_connections:
            self.stats.refused += 1
            await self._refuse(writer)
            return
        if self._tls is not None and not await self._handshake(writer, self._tls):
            return
        self.stats.connections += 1
        session = Session(self, reader, writer)
        self._sessions.add(session)
        await session.run()

    async def _handshake(self, writer: asyncio.StreamWriter, context: ssl.SSLContext) -> bool:
        """TLS, within ReadTimeout. Done here rather than by the server so that a refused
        handshake (a client certificate the CA did not sign, none where one is required,
        plain TCP) is an audit event: the server's own handshake drops it unheard."""
        self._handshakes += 1  # counts against MaxConnections: each holds a socket
        try:
            await writer.start_tls(context, ssl_handshake_timeout=self.settings.read_timeout)
        except (OSError, TimeoutError) as exc:
            peer = writer.get_extra_info("peername")
            address = peer[0] if isinstance(peer, tuple) else peer
            reason = str(exc) or type(exc).__name__  # a bare close is ConnectionResetError()
            audit.warning("TLS handshake failed: address=%s reason=%s", address, reason)
            writer.transport.abort()
            return False
        finally:
            self._handshakes -= 1
        return True

    async def _refuse(self, writer: asyncio.StreamWriter) -> None:
        """Beyond MaxConnections: say why, then close, without reading anything."""
        limit = self.settings.max_connections
        reason = f"too many connections: this gateway serves at most {limit} (MaxConnections)"
        peer = writer.get_extra_info("peername")
        log.warning(
            "refused a connection from %s: %s",
            peer,
            reason,
            extra={"event": "connection_refused", "peer": peer, "limit": limit},
        )
        writer.write(encode_frame(ack({}, "processed", reason)))
        writer.close()
        with suppress(ConnectionError):
            await writer.wait_closed()

    async def blocking(self, work: Callable[..., T], *args: Any) -> T:
        """Run blocking work on the gateway's pool, keeping the loop free."""
        return await self.loop.run_in_executor(self._executor, partial(work, *args))

    def run_thread(self, target: Callable[[], None], name: str) -> None:
        """A long-lived worker thread (a replay), joined when the gateway stops."""
        self._threads = [t for t in self._threads if t.is_alive()]
        thread = threading.Thread(target=target, name=name, daemon=True)
        self._threads.append(thread)
        thread.start()

    async def authenticate(self, credentials: Credentials) -> Identity:
        """Who the logon is (LogonFailed if nobody), after the wait that failed logons for
        its user or from its address impose (security/auth.py, Throttle). A logon with no
        password guesses nothing (anonymous, or a certificate TLS already verified): it
        is not throttled, so clients sharing an address (a NAT, the workers of one host)
        opening connections in parallel are not refused as if they had failed."""
        if credentials.password is None:  # no hash to check either: on the loop
            return self._audited(credentials, self.security.authentication.authenticate)
        throttle = self.security.throttle
        keys = [f"address {credentials.address}"]
        if credentials.user is not None:
            keys.append(f"user {credentials.user}")
        spaced = credentials.user != PEER_USER  # one peer logon per query leg (Throttle)
        try:
            wait = throttle.reserve(keys, spaced)
        except Throttled as exc:
            await asyncio.sleep(exc.pause)  # refused, but not at once (auth.py, Throttled)
            raise
        if wait > 0:
            await asyncio.sleep(wait)
        try:
            identity = await self.loop.run_in_executor(
                self._auth_pool,
                self._audited,
                credentials,
                self.security.authentication.authenticate,
            )
        except LogonFailed:
            throttle.failed(keys, spaced)
            raise
        throttle.succeeded(f"user {credentials.user}", *(keys if spaced else ()))
        return identity

    @staticmethod
    def _audited(
        credentials: Credentials, authenticate: Callable[[Credentials], Identity]
    ) -> Identity:
        """`authenticate(credentials)`, its outcome written to the audit log."""
        try:
            identity = authenticate(credentials)
        except LogonFailed as exc:
            audit.warning(
                "logon failed: user=%r address=%s reason=%s",
                credentials.user,
                credentials.address,
                exc.reason,
            )
            raise
        audit.info(
            "logon: user=%r method=%s address=%s",
            identity.user,
            identity.method,
            credentials.address,
        )
        return identity

    def claim(self, session: Session, name: str) -> None:
        """A client name belongs to one connection: a new logon of the same user replaces
        the old one; another user's is refused (it would disconnect a stranger)."""
        previous = self._names.get(name)
        if previous is not None and previous is not session:
            if _user(previous) != _user(session):
                audit.warning(
                    "refused: user=%r tried client name %r of user %r",
                    _user(session),
                    name,
                    _user(previous),
                )
                raise Denied(f"client name {name!r} is logged on as another user")
            log.info("%r replaced by a new logon with the same name", previous)
            previous.close()
        self._names[name] = session

    def sessions(self) -> list[Session]:
        """The connections now. On the event loop (the admin port asks it there)."""
        return list(self._sessions)

    def forget(self, session: Session) -> None:
        self._sessions.discard(session)
        self.buffers.forget(session)
        self.stats.closed.add(session.traffic)
        if session.client_name is not None and self._names.get(session.client_name) is session:
            del self._names[session.client_name]
        self.deletes.forget(session)
        if self.queues is not None:
            self.queues.forget(session)  # its links to queue owners close


def _user(session: Session) -> str | None:
    return session.identity.user if session.identity is not None else None


def new_loop(tls: bool) -> asyncio.AbstractEventLoop:
    """The gateway's event loop: uvloop's (libuv, compiled) where it is installed, which
    takes a quarter less work than asyncio's own for a command's turn of the loop (a
    heartbeat's round trip 117k -> 85k instructions; docs/performance.md, the look-up's
    sixth round). Not with TLS: uvloop's start_tls drops a ClientHello the connection
    read before the handshake began, and that handshake hangs (MagicStack/uvloop#707,
    open; it failed 5 of tests/security/test_gateway_attacks.py's TLS tests by chance).
    `AMPS_UVLOOP=0` in the environment gives asyncio's loop: to compare the two, or to
    rule uvloop out of a problem."""
    if not tls and os.environ.get("AMPS_UVLOOP", "1") != "0":
        with suppress(ImportError):
            import uvloop

            return uvloop.new_event_loop()
    return asyncio.new_event_loop()


def _shared_producer(bootstrap: str, settings: GatewayConfig) -> Producer | CompiledProducer:
    """The worker's one producer for every session (see server/publishing.py): Kafka is
    given PublishTimeout to acknowledge a publish, and its local queue room for the whole
    PublishBudget, so a publish waits for the budget on the event loop, never in produce().
    The compiled core's (log/native_producer.py) where it produces as confluent-kafka's
    would, else confluent-kafka's."""
    config = log_producer_config(
        bootstrap,
        **{
            "message.timeout.ms": int(settings.publish_timeout * 1000),
            "queue.buffering.max.kbytes": 2 * settings.max_publish_bytes_in_flight // 1024,
            "logger": ProducerLog(),  # an operator sees why Kafka can't be reached
        },
    )
    compiled = native_producer(config, client_config(bootstrap))
    return Producer(config) if compiled is None else compiled  # (its len() is 0: falsy)


def keep_alive(sock: Any) -> None:
    """TCP keepalive on a client's socket: a logged-on client may stay quiet for good, so
    without it a peer whose host vanished (no FIN, no RST) would hold its session and a
    MaxConnections slot until a write failed, which for a quiet one is never. Probes
    after KEEPALIVE_IDLE seconds of silence, KEEPALIVE_PROBES of them KEEPALIVE_INTERVAL
    apart: such a connection is closed about 2 minutes after its host went."""
    if sock is None:
        return
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for option, value in (
        ("TCP_KEEPIDLE", KEEPALIVE_IDLE),
        ("TCP_KEEPINTVL", KEEPALIVE_INTERVAL),
        ("TCP_KEEPCNT", KEEPALIVE_PROBES),
    ):
        if hasattr(socket, option):  # Linux names; other systems keep their defaults
            sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, option), value)
