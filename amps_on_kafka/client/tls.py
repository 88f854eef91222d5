"""TLS for the tcps:// transport, safe for one reading and one writing thread at once.

The transport reads on one thread (tcp_connection.py) while others write (tcp_outbox.py).
OpenSSL does not allow one SSL object to be used from two threads at once, which an
ssl.SSLSocket would do here (a recv blocked in one thread, a sendall in another), so the
TLS state is an SSLObject over memory buffers, used under a lock, while the socket's
blocking reads and writes happen outside it. Sends are also serialised: TLS records must
reach the wire in the order the SSLObject produced them.
"""

from __future__ import annotations

import socket
import ssl
import threading
from dataclasses import dataclass

from amps_on_kafka.errors import TransportError
from amps_on_kafka.security.tls import client_context

RECORD = 16 * 1024 + 512  # one TLS record at most, with its overhead


@dataclass(frozen=True)
class TlsOptions:
    """A tcps:// URI's TLS settings: the CA that signs the gateway's certificate (else
    the system's CAs) and, for mutual TLS, the client's certificate and key files."""

    ca: str | None = None
    cert: str | None = None
    key: str | None = None

    def context(self) -> ssl.SSLContext:
        return client_context(self.ca, self.cert, self.key)


class TlsSocket:
    """What the transport needs of a socket (recv, sendall, shutdown, close), over TLS."""

    def __init__(self, sock: socket.socket, context: ssl.SSLContext, host: str) -> None:
        self._sock = sock
        self._incoming = ssl.MemoryBIO()
        self._outgoing = ssl.MemoryBIO()
        self._tls = context.wrap_bio(self._incoming, self._outgoing, server_hostname=host)
        self._lock = threading.Lock()  # the SSLObject and its buffers
        self._send_lock = threading.Lock()  # the order of records on the wire
        self._handshake(host)

    def _handshake(self, host: str) -> None:
        while True:
            try:
                with self._lock:
                    self._tls.do_handshake()
                self._flush()
                return
            except ssl.SSLWantReadError:
                self._flush()
                if not self._receive():
                    raise TransportError(f"{host}: the gateway closed the TLS handshake") from None
            except ssl.SSLError as exc:
                raise TransportError(f"TLS handshake with the gateway failed: {exc}") from exc

    def recv(self, size: int) -> bytes:
        while True:
            with self._lock:
                try:
                    return self._tls.read(size)
                except ssl.SSLWantReadError:
                    pass
                except (ssl.SSLZeroReturnError, ssl.SSLEOFError):
                    return b""
            if self._outgoing.pending:
                self._flush()  # what reading produced (a key update's answer)
            if not self._receive():
                return b""

    def sendall(self, data: bytes) -> None:
        with self._send_lock:
            with self._lock:
                self._tls.write(data)
                records = self._outgoing.read()
            self._sock.sendall(records)

    def shutdown(self, how: int) -> None:
        self._sock.shutdown(how)

    def close(self) -> None:
        self._sock.close()

    def _receive(self) -> bool:
        data = self._sock.recv(RECORD)
        if data:
            with self._lock:
                self._incoming.write(data)
        return bool(data)

    def _flush(self) -> None:
        with self._send_lock:
            with self._lock:
                records = self._outgoing.read()
            if records:
                self._sock.sendall(records)
