"""Entitlements: which topics and queues a user may read and write, and which records.

Grants come from the configuration's Entitlements section: a user's own Read and Write,
those of its Roles, or Default's for a user without an entry. A topic in a grant is a
name, or (when it is not a valid topic name) an RE2 regular expression over whole names.

Read is what sow, subscribe, sow_and_subscribe, bookmark subscriptions and queue acks
need; Write what publish, delta_publish and sow_delete need. A Read grant may carry an
entitlement filter: the user sees only the records that match it. Several grants for the
same topic add up: one without a filter sees everything, else any of their filters lets a
record through.

Without an Entitlements section every user may do everything (AMPS without an
entitlement module); with one, nothing is allowed that no grant allows.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache

from amps_on_kafka.config.fields import check_topic_name
from amps_on_kafka.config.model import EntitlementsConfig, Permissions
from amps_on_kafka.errors import AmpsError
from amps_on_kafka.expr import Filter, compile_filter
from amps_on_kafka.expr.patterns import compile_pattern

#: Topics whose access each user's view remembers (an attacker may name any number).
CACHED_TOPICS = 1024


class Denied(AmpsError):
    """A command the user is not entitled to; the reason names command, topic and user."""


@dataclass(frozen=True)
class ReadAccess:
    """What a user may read of one topic: everything (filter None) or what matches."""

    filter: Filter | None

    @property
    def text(self) -> str | None:
        return self.filter.text if self.filter is not None else None


EVERYTHING = ReadAccess(None)


def is_pattern(topic: str) -> bool:
    """Whether `topic` is a regular expression over names rather than a name."""
    try:
        check_topic_name(topic)
    except ValueError:
        return True
    return False


def _matcher(pattern: str) -> Callable[[str], bool]:
    if is_pattern(pattern):
        return compile_pattern(rf"\A(?:{pattern})\z")
    return pattern.__eq__


class UserEntitlements:
    """One user's grants, resolved per topic (and remembered for CACHED_TOPICS topics)."""

    def __init__(self, user: str, grants: list[Permissions] | None) -> None:
        self.user = user
        self.unrestricted = grants is None
        self._write = [_matcher(t) for g in grants or () for t in g.write]
        self._read = [(_matcher(r.topic), r.filter) for g in grants or () for r in g.read]
        self.read = lru_cache(CACHED_TOPICS)(self._read_access)
        self.may_write = lru_cache(CACHED_TOPICS)(self._may_write)

    def _may_write(self, topic: str) -> bool:
        return self.unrestricted or any(match(topic) for match in self._write)

    def _read_access(self, topic: str) -> ReadAccess | None:
        """None when the user may not read `topic` at all."""
        if self.unrestricted:
            return EVERYTHING
        filters = [text for match, text in self._read if match(topic)]
        if not filters:
            return None
        if None in filters:
            return EVERYTHING
        unique = list(dict.fromkeys(filters))
        text = unique[0] if len(unique) == 1 else " OR ".join(f"({f})" for f in unique)
        return ReadAccess(compile_filter(text))

    def check_write(self, command: str, topic: str) -> None:
        if not self.may_write(topic):
            where = "from" if command == "sow_delete" else "to"
            raise Denied(f"not entitled: user {self.user!r} may not {command} {where} {topic!r}")

    def check_read(self, command: str, topic: str) -> ReadAccess:
        access = self.read(topic)
        if access is None:
            raise Denied(f"not entitled: user {self.user!r} may not {command} {topic!r}")
        return access


class Entitlements:
    """The configuration's Entitlements section, looked up by user."""

    def __init__(self, config: EntitlementsConfig | None) -> None:
        self.config = config

    def for_user(self, user: str) -> UserEntitlements:
        config = self.config
        if config is None:
            return UserEntitlements(user, None)
        own = config.users.get(user, config.default)
        if own is None:
            return UserEntitlements(user, [])
        return UserEntitlements(user, [own, *(config.roles[r] for r in own.roles)])
