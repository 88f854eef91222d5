"""Every error the project raises on purpose derives from AmpsError.

Callers (the CLI, the gateway) catch AmpsError to turn a problem into a clear message
or a failure ack; anything else escaping is a bug.
"""


class AmpsError(Exception):
    """Base of all errors that carry a reason meant for the user."""

    @property
    def reason(self) -> str:
        return str(self)


class ConfigError(AmpsError, ValueError):
    """A configuration file or value is wrong; the message names the file and key."""


class InvalidBookmark(AmpsError, ValueError):
    """A bookmark is malformed, names an unknown topic or partition, or is outside the log."""


class UnknownTopic(AmpsError, LookupError):
    """A command names a topic that does not exist (topics are never auto-created)."""


class FilterError(AmpsError, ValueError):
    """A filter or expression does not compile; the message names the position."""


class PublishError(AmpsError):
    """Kafka did not acknowledge a publish; the message was not persisted."""


class MessageError(AmpsError, ValueError):
    """A message payload or envelope is not valid for its topic."""


class OptionError(AmpsError, ValueError):
    """A subscription option is unknown, malformed, or can't be combined with another."""


class TransportError(AmpsError, ConnectionError):
    """The transport to Kafka or to a gateway failed."""


class WrongTransport(AmpsError, TypeError):
    """The connection's transport does not serve this command: sow, subscribe, ack or
    heartbeat on kafka:// (they need a worker's gateway), `until` on tcp://. Not a
    TransportError: the connection is fine, and a reconnecting client must not fail over
    (it would try again forever)."""


class ServerError(AmpsError):
    """The gateway refused a command; the message is the server's reason."""


class PartitionsMoving(TransportError):
    """Part of a topic has no worker that can answer for it now (its partitions are
    moving between workers): the reason starts with "retry:"; asking again shortly works."""


# The kinds of refusal a gateway names in a failure ack (its "error" key), so that a
# tcp:// client raises for a problem the class a kafka:// client raises for the same one.
_WIRE_KINDS: tuple[type[AmpsError], ...] = (
    InvalidBookmark,
    UnknownTopic,
    FilterError,
    MessageError,
)
# A refusal of one of those kinds is both a ServerError and the kind itself, so
# `except UnknownTopic` works on either transport and `except ServerError` still does.
_SERVER_ERRORS: dict[str, type[ServerError]] = {
    kind.__name__: type(
        kind.__name__,
        (ServerError, kind),
        {"__doc__": f"{kind.__doc__} (refused by the gateway)", "__module__": __name__},
    )
    for kind in _WIRE_KINDS
}


def wire_kind(error: AmpsError) -> str | None:
    """The name a failure ack gives `error`'s kind, if it is one clients raise alike."""
    return next((kind.__name__ for kind in _WIRE_KINDS if isinstance(error, kind)), None)


def server_error(reason: str, kind: object = None) -> ServerError:
    """The gateway's refusal as a client raises it: of `kind` too when it names one."""
    cls = _SERVER_ERRORS.get(kind, ServerError) if isinstance(kind, str) else ServerError
    return cls(reason)
