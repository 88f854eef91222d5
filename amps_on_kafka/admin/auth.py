"""Who may read the admin port: whoever may log on to the gateway (the config's
Authentication, docs/security.md), with HTTP Basic credentials.

A request without credentials passes only when Authentication allows Anonymous; with
Admin.Users, only the users it lists pass. Checks
follow the gateway's logon: the same users file, and the same Throttle of failures per
address and per user (FailureDelay doubled up to MaxFailureDelay). Passwords are
verified one at a time, since an argon2 hash takes 64 MiB: a flood of guesses waits in
line rather than growing the worker. /health and /ready never ask (server.py).
"""

from __future__ import annotations

import base64
import binascii
import threading
import time
from collections.abc import Collection
from typing import Any

from amps_on_kafka.security.auth import Credentials, LogonFailed, audit
from amps_on_kafka.security.policy import Security

Environ = dict[str, Any]


class BasicAuth:
    """An `authorize` hook for AdminServer."""

    def __init__(self, security: Security, users: Collection[str] | None = None) -> None:
        self.authentication = security.authentication
        self.users = None if users is None else frozenset(users)  # Admin.Users
        self.throttle = security.throttle
        self._throttle_lock = threading.Lock()  # the Throttle is not thread-safe
        self._verify_lock = threading.Lock()  # one password hash at a time

    def __call__(self, environ: Environ) -> bool:
        credentials = basic_credentials(environ)
        if credentials is None:  # a header that does not decode
            return False
        if credentials.user is None and not self.authentication.anonymous:
            return False  # the browser's first try, before it asks for a password
        keys = [f"address {credentials.address}"]
        if credentials.user is not None:
            keys.append(f"user {credentials.user}")
        try:
            with self._throttle_lock:
                wait = self.throttle.reserve(keys)
        except LogonFailed:  # it would wait more than MaxFailureDelay: refused untried
            return False
        if wait > 0:
            time.sleep(wait)  # this request's own thread; requests at once are bounded
        try:
            with self._verify_lock:
                identity = self.authentication.authenticate(credentials)
        except LogonFailed as exc:
            with self._throttle_lock:
                self.throttle.failed(keys)
            audit.warning(
                "admin port: refused user=%r address=%s reason=%s",
                credentials.user,
                credentials.address,
                exc.reason,
            )
            return False
        with self._throttle_lock:
            self.throttle.succeeded(f"user {credentials.user}", *keys)
        if self.users is not None and identity.user not in self.users:
            audit.warning(
                "admin port: refused user=%r address=%s reason=not in Admin.Users",
                identity.user,
                credentials.address,
            )
            return False
        return True


def basic_credentials(environ: Environ) -> Credentials | None:
    """The request's Basic credentials (user None when it has none); None when its
    Authorization header is not Basic base64 of `user:password`."""
    address = environ.get("REMOTE_ADDR", "?")
    header = environ.get("HTTP_AUTHORIZATION")
    if header is None:
        return Credentials(None, address=address)
    scheme, _, encoded = header.partition(" ")
    if scheme.lower() != "basic":
        return None
    try:
        decoded = base64.b64decode(encoded.strip(), validate=True).decode()
    except (binascii.Error, UnicodeDecodeError):
        return None
    user, colon, password = decoded.partition(":")
    if not colon or not user:
        return None
    return Credentials(user, password, address=address)
