"""Authentication at logon: who a session is, or a refusal.

Pluggable: an Authenticator looks at a logon's Credentials and names the user, refuses
(LogonFailed), or passes (None: not its kind of credentials). `Authentication` asks the
configured ones in order — the client certificate, the users file — and falls back to
anonymous only when the configuration says `Anonymous: true`.

Failed logons are audit events (logger `amps_on_kafka.audit`) and slow the next attempts
down (Throttle): per user and per address, FailureDelay doubled per failure up to
MaxFailureDelay, so guessing goes at a bounded, slow rate whatever the number of
connections. The waiting is asyncio's (no thread is held) and password hashes are
verified on a pool of their own (argon2 takes 64 MiB and tens of ms per hash), so a flood
of logons neither blocks the event loop nor takes the threads queries run on.
"""

from __future__ import annotations

import hmac
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from amps_on_kafka.config.model import AuthenticationConfig
from amps_on_kafka.errors import AmpsError
from amps_on_kafka.security.users import ANONYMOUS, PEER_USER, UsersFile

audit = logging.getLogger("amps_on_kafka.audit")

#: Entries of the throttle kept at most; beyond, the oldest are forgotten first (an
#: attacker cycling through addresses must not grow the gateway's memory).
MAX_THROTTLED = 10_000
#: A key without failures for this long is forgotten: its next failure starts again.
FORGET_AFTER = 15 * 60.0


class LogonFailed(AmpsError):
    """A logon is refused; the reason is what the client is told."""


@dataclass(frozen=True)
class Credentials:
    """What a logon presents: `user_id` and `pw` from the command, the subject (CN) of
    the client certificate TLS verified, and the peer's address."""

    user: str | None
    password: str | None = field(default=None, repr=False)
    certificate_subject: str | None = None
    address: str = "?"


@dataclass(frozen=True)
class Identity:
    """An authenticated user; anonymous sessions are the user `anonymous`."""

    user: str
    method: str  # "password", "certificate", "anonymous" or "peer" (another gateway)

    @property
    def anonymous(self) -> bool:
        return self.method == "anonymous"

    def publisher_id(self, client_name: str) -> str:
        """The id stamped on what this session publishes: `user:client_name`, so one
        user cannot publish under (or poison the sequence numbers of) another's id.
        Client names hold no ':', so no name of an anonymous session, which stays
        as it is, can look like an authenticated one."""
        return client_name if self.anonymous else f"{self.user}:{client_name}"


class Authenticator(Protocol):
    method: str

    def authenticate(self, credentials: Credentials) -> str | None:
        """The user's name; None when these credentials are not for this authenticator;
        LogonFailed when they are and are wrong."""


class CertificateAuthenticator:
    """The subject (CN) of a client certificate the gateway's CA signed is the user."""

    method = "certificate"

    def authenticate(self, credentials: Credentials) -> str | None:
        subject = credentials.certificate_subject
        if subject is None:
            return None
        if subject == ANONYMOUS or subject.startswith("_"):
            raise LogonFailed(f"certificate subject {subject!r} is reserved")
        if credentials.user is not None and credentials.user != subject:
            raise LogonFailed(
                f"user_id {credentials.user!r} is not the client certificate's subject"
            )
        return subject


class PasswordAuthenticator:
    """user_id and pw against the users file's argon2 hashes."""

    method = "password"

    def __init__(self, users: UsersFile) -> None:
        self.users = users

    def authenticate(self, credentials: Credentials) -> str | None:
        if credentials.password is None:
            return None
        if credentials.user is None:
            raise LogonFailed("a logon with a password (pw) needs user_id")
        if not self.users.verify(credentials.user, credentials.password):
            raise LogonFailed("wrong user_id or password")  # not which: names stay secret
        return credentials.user


class PeerAuthenticator:
    """Another gateway of the same group (server/cluster.py): user_id `_peer` and the
    configuration's PeerSecret. Its session may read everything: what it forwards was
    checked, and narrowed to the user's entitlement filters, by the gateway it came to."""

    method = "peer"

    def __init__(self, secret: str | None) -> None:
        self.secret = secret

    def authenticate(self, credentials: Credentials) -> str | None:
        if credentials.user != PEER_USER:
            return None
        given = (credentials.password or "").encode()
        if self.secret is None or not hmac.compare_digest(given, self.secret.encode()):
            raise LogonFailed("wrong user_id or password")
        return PEER_USER


class Authentication:
    """The configured authenticators, in order, then anonymous if allowed."""

    def __init__(
        self, authenticators: Sequence[Authenticator], *, anonymous: bool
    ) -> None:
        self.authenticators = tuple(authenticators)
        self.anonymous = anonymous

    @classmethod
    def from_config(cls, config: AuthenticationConfig) -> Authentication:
        secret = config.peer_secret.get_secret_value() if config.peer_secret else None
        authenticators: list[Authenticator] = [PeerAuthenticator(secret)]
        if config.client_certificate:
            authenticators.append(CertificateAuthenticator())
        if config.users_file is not None:
            authenticators.append(PasswordAuthenticator(UsersFile(config.users_file)))
        return cls(authenticators, anonymous=config.anonymous)

    @classmethod
    def open(cls) -> Authentication:
        """Anyone, anonymously: for a gateway embedded without a configuration (tests)."""
        return cls([PeerAuthenticator(None)], anonymous=True)

    def authenticate(self, credentials: Credentials) -> Identity:
        """Blocking (a password is verified with argon2): call it off the event loop."""
        for authenticator in self.authenticators:
            user = authenticator.authenticate(credentials)
            if user is not None:
                return Identity(user, authenticator.method)
        if credentials.password is not None or credentials.certificate_subject is not None:
            raise LogonFailed("these credentials are not accepted by this gateway")
        if self.anonymous and credentials.user is None:
            return Identity(ANONYMOUS, "anonymous")
        raise LogonFailed(f"authentication required: {self._accepted()}")

    def _accepted(self) -> str:
        ways = [_WAYS[a.method] for a in self.authenticators if a.method in _WAYS]
        return " or ".join(ways) if ways else "this gateway accepts no logon (see Authentication)"


_WAYS = {
    "certificate": "a client certificate (tcps:// with cert and key)",
    "password": "user_id and pw",
}


@dataclass
class _Failures:
    count: int = 0
    next_allowed: float = 0.0
    last: float = 0.0


class Throttle:
    """Slows logon attempts after failures, per key (an address, a user).

    A key's n-th consecutive failure makes its next attempt wait until
    delay(n) = min(base * 2**(n-1), cap) after it; attempts that come meanwhile queue one
    behind the other, each delay(n) apart, so parallel connections guess no faster.
    A success clears its user's failures (not its address's).
    """

    def __init__(
        self, base: float, cap: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.base = base
        self.cap = cap
        self.clock = clock
        self._keys: dict[str, _Failures] = {}

    def delay(self, failures: int) -> float:
        if failures <= 0:
            return 0.0
        return min(self.base * 2 ** min(failures - 1, 64), self.cap)

    def reserve(self, keys: Sequence[str]) -> float:
        """Seconds this attempt must wait before it is tried."""
        now = self.clock()
        entries = [e for e in map(self._keys.get, keys) if e is not None and e.count]
        start = max([now, *(e.next_allowed for e in entries)])
        for entry in entries:
            entry.next_allowed = start + self.delay(entry.count)
        return start - now

    def failed(self, keys: Sequence[str]) -> None:
        now = self.clock()
        self._forget_old(now)
        for key in keys:
            entry = self._keys.pop(key, None) or _Failures()
            entry.count += 1
            entry.last = now
            entry.next_allowed = max(entry.next_allowed, now + self.delay(entry.count))
            self._keys[key] = entry  # most recent last: eviction takes the oldest

    def succeeded(self, key: str) -> None:
        self._keys.pop(key, None)

    def __len__(self) -> int:
        return len(self._keys)

    def _forget_old(self, now: float) -> None:
        for key in list(self._keys):
            entry = self._keys[key]
            if len(self._keys) < MAX_THROTTLED and now - entry.last < FORGET_AFTER:
                break  # in order of last failure: the rest are newer
            del self._keys[key]
