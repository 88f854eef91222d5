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
from collections import deque
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
#: Attempts of one key tried at once, before any of them failed, without waiting. Beyond,
#: each is spaced as if those still in flight had failed: 20 connections that all sent a
#: wrong password at once were 20 guesses, tried before the first failure was counted.
FREE_ATTEMPTS = 2
#: How long after its start an attempt counts as in flight for that spacing (a password
#: hash takes tens of milliseconds; this covers a busy machine).
IN_FLIGHT = 2.0


class LogonFailed(AmpsError):
    """A logon is refused; the reason is what the client is told."""


class Throttled(LogonFailed):
    """Refused untried: the attempt would have waited more than MaxFailureDelay. The
    gateway answers it after `pause`, so that refusals cost the guesser time rather than
    the event loop (answered at once, 20 connections were refused 6,000 times a second,
    each a turn of the gateway's loop)."""

    def __init__(self, reason: str, pause: float) -> None:
        super().__init__(reason)
        self.pause = pause


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

    def __init__(self, authenticators: Sequence[Authenticator], *, anonymous: bool) -> None:
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
    # starts of the latest attempts (those within IN_FLIGHT count as in flight)
    tried: deque[float] = field(default_factory=lambda: deque(maxlen=64))
    refused: int = 0  # attempts refused untried since the last one tried

    def in_flight(self, now: float) -> int:
        while self.tried and self.tried[0] <= now - IN_FLIGHT:
            self.tried.popleft()
        return len(self.tried)


class Throttle:
    """Slows logon attempts after failures, per key (an address, a user).

    A key's n-th consecutive failure makes its next attempt wait until
    delay(n) = min(base * 2**(n-1), cap) after it; attempts that come meanwhile queue one
    behind the other, each delay(n) apart, so parallel connections guess no faster.
    Attempts still in flight beyond FREE_ATTEMPTS count as failures for that spacing, so
    a burst sent before the first failure is slowed too. An attempt that would wait more
    than `cap` is refused untried (Throttled): waits never pile up beyond cap, and a
    connection that gave up holds no place for minutes.
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

    def reserve(self, keys: Sequence[str], spaced: bool = True) -> float:
        """Seconds this attempt must wait before it is tried; Throttled when that would
        be more than `cap`. Every attempt reserved ends with failed() or succeeded(),
        given the same `spaced`. An attempt not `spaced` waits for its keys' failures
        but is not counted in flight: another gateway's peer logons (one per query leg,
        many at once from one address), whose secret no person chose."""
        now = self.clock()
        self._forget_old(now)
        entries = [self._touched(key, now) for key in keys]
        start = max([now, *(e.next_allowed for e in entries)])
        first = entries[0]
        if start - now > self.cap:
            reason = f"too many failed logons: try again in {start - now:.0f} s"
            first.refused += 1
            if first.refused == 1:  # once, not once per attempt: they cost nothing
                audit.warning("logon refused untried: %s: %s", ", ".join(keys), reason)
            raise Throttled(reason, self.delay(max(1, *(e.count for e in entries))))
        if first.refused > 1:
            audit.warning("%d more logons refused untried: %s", first.refused - 1, ", ".join(keys))
        first.refused = 0
        for entry in entries if spaced else ():
            extra = max(0, entry.in_flight(now) + 1 - FREE_ATTEMPTS)
            entry.tried.append(start)
            entry.next_allowed = max(entry.next_allowed, start + self.delay(entry.count + extra))
        return start - now

    def _touched(self, key: str, now: float) -> _Failures:
        """The key's entry, made the most recent (eviction takes the oldest)."""
        entry = self._keys.pop(key, None) or _Failures()
        entry.last = now
        self._keys[key] = entry
        return entry

    def failed(self, keys: Sequence[str], spaced: bool = True) -> None:
        now = self.clock()
        self._forget_old(now)
        for key in keys:
            entry = self._touched(key, now)
            if spaced:
                _end_attempt(entry)
            entry.count += 1
            entry.next_allowed = max(entry.next_allowed, now + self.delay(entry.count))

    def succeeded(self, key: str, *ended: str) -> None:
        """Clears `key`'s failures (its user's); the attempt ends for the `ended` keys
        (its address's) too, which keep their failures."""
        for other in ended:
            entry = self._keys.get(other)
            if entry is not None:
                _end_attempt(entry)
        self._keys.pop(key, None)

    def __len__(self) -> int:
        return len(self._keys)

    def _forget_old(self, now: float) -> None:
        for key in list(self._keys):
            entry = self._keys[key]
            if len(self._keys) < MAX_THROTTLED and now - entry.last < FORGET_AFTER:
                break  # in order of last failure: the rest are newer
            del self._keys[key]


def _end_attempt(entry: _Failures) -> None:
    """An attempt of this key was answered: one fewer in flight."""
    if entry.tried:
        entry.tried.popleft()
