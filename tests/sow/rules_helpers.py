"""Building log records by hand, as the broker would hand them to the worker."""

from __future__ import annotations

import orjson

from amps_on_kafka.config import SowConfig
from amps_on_kafka.log.codecs import JSON
from amps_on_kafka.log.envelope import Command, Envelope
from amps_on_kafka.log.message import LogMessage
from amps_on_kafka.state.sow import Applied, DictState, SowRules


class Log:
    """A partition of a SOW topic fed record by record to the rules, with a clock."""

    def __init__(self, key="/id", expiration="disabled", **extra) -> None:
        sow = SowConfig.model_validate(
            {"Topic": "t", "Key": key, "Expiration": expiration, **extra}
        )
        self.rules = SowRules(sow, JSON)
        self.state = DictState()
        self.offset = 0
        self.applied = Applied()

    def send(self, at_ms: int, command=Command.PUBLISH, data=None, **envelope) -> Applied:
        raw = orjson.dumps(data) if data is not None and not isinstance(data, bytes) else data
        headers = Envelope(
            command=command, publisher_id="p", sequence=self.offset, **envelope
        ).to_headers()
        message = LogMessage("t", 0, self.offset, at_ms, raw, headers, JSON)
        self.offset += 1
        out = Applied()
        self.rules.apply(self.state, message, out)
        self.applied.changes += out.changes
        self.applied.results += out.results
        return out

    def publish(self, at_ms, data, **kw):
        return self.send(at_ms, Command.PUBLISH, data, **kw)

    def delta(self, at_ms, data, **kw):
        return self.send(at_ms, Command.DELTA_PUBLISH, data, **kw)

    def delete(self, at_ms, **kw):
        return self.send(at_ms, Command.SOW_DELETE, kw.pop("data", None), **kw)

    def sweep(self, now_ms):
        """What the worker's expiry sweep does at `now_ms`."""
        due = [r.sow_key for r in self.state.current() if r.expired_at(now_ms)]
        return [c for c in (self.rules.expire(self.state, k, now_ms) for k in due) if c]

    def view(self, now_ms=None):
        """The SOW as a query sees it: key → data, expired records hidden."""
        return {
            k: r.data
            for k, r in self.state.records.items()
            if now_ms is None or not self.rules.is_expired(r, now_ms)
        }
