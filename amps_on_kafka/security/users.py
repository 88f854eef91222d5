"""The users file: one `name:argon2-hash` line per user, managed by `amps-kafka users`.

Hashes are argon2id with a random salt each (argon2-cffi's PasswordHasher, RFC 9106's
low-memory profile: 64 MiB and 3 passes per hash), so a stolen file costs an attacker that
much per guess and per user. The file holds no password. It is written whole to a
temporary file and renamed, readable by its owner only.
"""

from __future__ import annotations

import os
import re
import tempfile
from functools import cache
from pathlib import Path

from argon2 import PasswordHasher
from argon2.exceptions import InvalidHashError, VerificationError

from amps_on_kafka.errors import ConfigError

# Names that can key entitlements and stand in a publisher id (user:client_name); a
# leading '_' is the gateway's own (PEER_USER).
_NAME = re.compile(r"^[A-Za-z0-9.@-][A-Za-z0-9._@-]{0,127}$")
ANONYMOUS = "anonymous"  # the user an anonymous session is, for entitlements and audit
PEER_USER = "_peer"  # the user a gateway of the same group logs on to another as
MAX_USERS_FILE_BYTES = 16 * 1024 * 1024

_HASHER = PasswordHasher()


@cache
def _dummy_hash() -> str:
    """Verified when the user is unknown, so that a wrong name costs the same time as a
    wrong password and timing does not tell which names exist. Made with the first
    UsersFile (before any logon, so even the first unknown name takes no longer), not
    at import: a hash takes ~0.25 s of CPU, which every `amps-kafka` command paid."""
    return _HASHER.hash("not a password of anyone")


def check_user_name(name: str) -> str:
    if not _NAME.match(name):
        raise ConfigError(
            f"user name {name!r}: 1-128 letters, digits, '.', '_', '@' or '-' (not '_' "
            "first) please"
        )
    if name == ANONYMOUS:
        raise ConfigError(f"user name {ANONYMOUS!r} is reserved for anonymous sessions")
    return name


class UsersFile:
    """A users file on disk; read again whenever it changed, so `users add` needs no
    restart of the gateway."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._stamp: tuple[int, int, int] | None = None
        self._hashes: dict[str, str] = {}
        _dummy_hash()

    def hashes(self) -> dict[str, str]:
        """name -> hash, as the file holds them now ({} when it does not exist)."""
        try:
            stat = self.path.stat()
        except FileNotFoundError:
            return {}
        except OSError as exc:
            raise ConfigError(f"{self.path}: can't read the users file: {exc.strerror}") from exc
        # The inode too: `users add` replaces the file, and a changed password keeps its
        # size, while two writes within the clock's tick (a few ms) share an mtime.
        stamp = (stat.st_ino, stat.st_mtime_ns, stat.st_size)
        if stamp != self._stamp:
            self._hashes = _parse(self.path)
            self._stamp = stamp
        return self._hashes

    def verify(self, name: str, password: str) -> bool:
        """Whether `password` is `name`'s. Slow on purpose (argon2): call it off the loop."""
        stored = self.hashes().get(name)
        try:
            return _HASHER.verify(stored or _dummy_hash(), password) and stored is not None
        except (VerificationError, InvalidHashError):
            return False

    def add(self, name: str, password: str) -> bool:
        """Add `name`, or change its password; True when it is new."""
        check_user_name(name)
        if not password:
            raise ConfigError("the password must not be empty")
        hashes = dict(self.hashes())
        new = name not in hashes
        hashes[name] = _HASHER.hash(password)
        self._write(hashes)
        return new

    def remove(self, name: str) -> None:
        hashes = dict(self.hashes())
        if hashes.pop(name, None) is None:
            raise ConfigError(f"{self.path}: no user {name!r}")
        self._write(hashes)

    def _write(self, hashes: dict[str, str]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd, temporary = tempfile.mkstemp(dir=self.path.parent, prefix=f".{self.path.name}.")
        try:
            with os.fdopen(fd, "w") as out:  # mkstemp makes it 0600
                out.writelines(f"{name}:{digest}\n" for name, digest in sorted(hashes.items()))
            os.replace(temporary, self.path)
        except BaseException:
            Path(temporary).unlink(missing_ok=True)
            raise
        self._stamp = None


def _parse(path: Path) -> dict[str, str]:
    with path.open("rb") as file:
        data = file.read(MAX_USERS_FILE_BYTES + 1)
    if len(data) > MAX_USERS_FILE_BYTES:
        raise ConfigError(f"{path}: larger than {MAX_USERS_FILE_BYTES} bytes: not a users file")
    hashes = {}
    for number, line in enumerate(data.decode("utf-8", "replace").splitlines(), 1):
        if not line.strip() or line.startswith("#"):
            continue
        name, colon, digest = line.partition(":")
        if not colon or not _NAME.match(name) or not digest.startswith("$argon2"):
            raise ConfigError(f"{path}, line {number}: not `name:argon2-hash`")
        hashes[name] = digest
    return hashes
