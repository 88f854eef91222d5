"""The configuration model, in AMPS vocabulary (Topic, Key, Expiration, MessageType...).

Unknown keys are errors: a misspelt option that silently does nothing is the worst kind
of configuration bug in a messaging system. A queue's section is config/queues.py; what
every section is made of (the strict base, durations, topic names) config/fields.py.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Literal

from pydantic import (
    BeforeValidator,
    Field,
    SecretStr,
    field_serializer,
    field_validator,
    model_validator,
)

from amps_on_kafka.config.durations import parse_duration
from amps_on_kafka.config.fields import (
    TOPIC_NAME,
    Seconds,
    Strict,
    check_filter,
    check_topic_name,
)
from amps_on_kafka.config.properties import redacted, resolve_all
from amps_on_kafka.config.queues import QueueConfig
from amps_on_kafka.errors import ConfigError
from amps_on_kafka.expr.patterns import PatternError, compile_pattern

MessageType = Literal["json", "avro", "binary"]
# How the topic's producers place a keyed record (log/keys.py's partition_for has each).
Partitioner = Literal["murmur2", "crc32", "fnv1a"]


def check_key_path(path: object) -> str:
    """A SOW Key path as every entry point takes it (the config, `topics create --key`):
    one registered as `id` would give every record the same missing key."""
    if not isinstance(path, str) or not re.fullmatch(r"(/[^/\s]+)+", path):
        raise ValueError(f"Key path {path!r} must look like /field or /a/b")
    return path


class TopicConfig(Strict):
    """A log topic: one Kafka topic, the transaction log for one logical topic."""

    name: str = Field(alias="Name")
    partitions: int = Field(1, alias="Partitions", ge=1, le=10_000)
    replication_factor: int = Field(1, alias="ReplicationFactor", ge=1)
    message_type: MessageType = Field("json", alias="MessageType")
    schema_path: Path | None = Field(None, alias="Schema")
    retention: Seconds | None = Field(None, alias="Retention")
    partitioner: Partitioner = Field("murmur2", alias="Partitioner")

    _check_name = field_validator("name")(check_topic_name)

    @model_validator(mode="after")
    def _avro_needs_schema(self) -> TopicConfig:
        if self.message_type == "avro" and self.schema_path is None:
            raise ValueError("MessageType avro needs a Schema (path to an .avsc file)")
        return self


class Expiration(Strict):
    """Seed 000: disabled (default), enabled (per-message only) or a topic default."""

    mode: Literal["disabled", "enabled"]
    # At most 100 years, log/envelope.py's MAX_EXPIRATION: a deadline must fit the stored
    # record, and a default of `.inf` would make the worker refuse every record.
    default_seconds: float | None = Field(None, ge=0, le=100 * 365.25 * 86_400)

    @classmethod
    def parse(cls, value: object) -> Expiration:
        if isinstance(value, Expiration):
            return value
        if value is None or value is False or str(value).lower() == "disabled":
            return cls(mode="disabled")
        if value is True or str(value).lower() == "enabled":
            return cls(mode="enabled")
        return cls(mode="enabled", default_seconds=parse_duration(value))  # type: ignore[arg-type]


class SowConfig(Strict):
    """A SOW topic: the latest record per key of one log topic."""

    topic: str = Field(alias="Topic")
    key: tuple[str, ...] = Field(alias="Key")
    expiration: Annotated[Expiration, BeforeValidator(Expiration.parse)] = Field(
        default_factory=lambda: Expiration(mode="disabled"), alias="Expiration"
    )
    key_from_publish: bool = Field(False, alias="KeyFromPublish")
    dead_letter_topic: str | None = Field(None, alias="DeadLetterTopic")
    # Without it a DeadLetterTopic missing from Kafka stops the worker at startup.
    create_dead_letter_topic: bool = Field(False, alias="CreateDeadLetterTopic")
    # The topic's records are unkeyed or keyed by something else: the worker re-keys them
    # by SOW key into _amps_repartition.<Topic> and keeps the SOW from that (docs/operations.md).
    repartition: bool = Field(False, alias="Repartition")
    # Each partition's state is also written to the compacted _amps_changelog.<group>.<Topic>,
    # from which a worker with no store restores it (processor/changelog.py, docs/scaling.md).
    changelog: bool = Field(False, alias="Changelog")

    @field_validator("key", mode="before")
    @classmethod
    def _key_paths(cls, value: object) -> tuple[str, ...]:
        if value is not None and not isinstance(value, str | list | tuple):
            raise ValueError(f"Key must be a path such as /id or a list of them, not {value!r}")
        paths = (value,) if isinstance(value, str) else tuple(value or ())
        if not paths:
            raise ValueError("Key needs at least one path such as /id")
        for path in paths:
            check_key_path(path)
        return paths


class KafkaConfig(Strict):
    """Where Kafka is and how every client of the project connects to it.

    Properties are librdkafka's (security.protocol, sasl.*, ssl.*, client.id...), given to
    every producer, consumer and admin client; ${env:NAME} and ${file:PATH} in a value are
    resolved at load (config/properties.py). Secret values never show in a repr or a dump.
    """

    bootstrap_servers: str | None = Field(None, alias="BootstrapServers")
    properties: dict[str, str] = Field(default_factory=dict, alias="Properties")

    @field_validator("properties", mode="before")
    @classmethod
    def _resolve(cls, value: object) -> dict[str, str]:
        if value is None:
            return {}
        if not isinstance(value, dict):
            raise ValueError("Properties must be a mapping of Kafka client properties")
        return resolve_all(value)

    @model_validator(mode="after")
    def _one_bootstrap(self) -> KafkaConfig:
        """bootstrap.servers among the properties stands for BootstrapServers."""
        given = self.properties.pop("bootstrap.servers", None)
        if given is not None and self.bootstrap_servers not in (None, given):
            raise ValueError("give the bootstrap servers once: BootstrapServers or Properties")
        if given is not None:
            object.__setattr__(self, "bootstrap_servers", given)
        return self

    @field_serializer("properties")
    def _dump_redacted(self, properties: dict[str, str]) -> dict[str, str]:
        return redacted(properties)

    def __repr_args__(self):  # the repr pydantic builds, secrets redacted
        for name, value in super().__repr_args__():
            yield name, redacted(value) if name == "properties" else value


def check_listen(address: str) -> str:
    """A gateway address, HOST:PORT (HOST may be empty for 127.0.0.1; port 0 picks a free
    one). Checked at load so a bad value is a config error naming Gateway.Listen, not a
    traceback from the gateway once the worker has recovered its stores."""
    host, colon, port = address.rpartition(":")
    numeric = port.isascii() and port.isdigit()
    if not colon or not numeric or int(port) > 65_535 or any(c.isspace() for c in host):
        raise ValueError(
            f"{address!r} is not HOST:PORT (a port from 0 to 65535), e.g. 127.0.0.1:9007"
        )
    return address


def same_port(a: str, b: str) -> bool:
    """Whether two checked HOST:PORT addresses would bind the same port (port 0 picks a
    free one each time; an empty HOST is 127.0.0.1; 0.0.0.0 and :: take every host)."""
    (host_a, _, port_a), (host_b, _, port_b) = a.rpartition(":"), b.rpartition(":")
    if int(port_a) == 0 or int(port_a) != int(port_b):
        return False
    everywhere = ("0.0.0.0", "::", "[::]")
    host_a, host_b = host_a or "127.0.0.1", host_b or "127.0.0.1"
    return host_a == host_b or host_a in everywhere or host_b in everywhere


class TLSConfig(Strict):
    """The gateway's TLS (docs/security.md): its certificate and key, and the CA that signs
    the client certificates it accepts. Paths are relative to the configuration file."""

    certificate: Path = Field(alias="Certificate")
    key: Path = Field(alias="Key")
    ca: Path | None = Field(None, alias="CA")
    require_client_certificate: bool = Field(False, alias="RequireClientCertificate")

    @model_validator(mode="after")
    def _client_certificates_need_a_ca(self) -> TLSConfig:
        if self.require_client_certificate and self.ca is None:
            raise ValueError("RequireClientCertificate needs CA (the CA that signs them)")
        return self


class GatewayConfig(Strict):
    """The gateway's bounds (docs/operations.md, The gateway's bounds): every connection,
    command, reply and publish it holds is capped, so no client and no Kafka outage can
    grow the worker's memory without limit."""

    listen: str = Field("127.0.0.1:9007", alias="Listen")
    max_frame_bytes: int = Field(4 * 1024 * 1024, alias="MaxFrameBytes", ge=1024)
    max_connections: int = Field(1000, alias="MaxConnections", ge=1)
    read_timeout: Seconds = Field(30.0, alias="ReadTimeout", gt=0)
    max_queued_bytes: int = Field(64 * 1024 * 1024, alias="MaxQueuedBytes", ge=64 * 1024)
    # the sum over all connections (server/buffers.py): AMPS's MessageMemoryLimit
    max_buffered_bytes: int = Field(256 * 1024 * 1024, alias="MaxBufferedBytes", ge=64 * 1024)
    max_commands_in_flight: int = Field(16, alias="MaxCommandsInFlight", ge=1)
    max_subscriptions: int = Field(100, alias="MaxSubscriptions", ge=1)
    max_publish_bytes_in_flight: int = Field(
        32 * 1024 * 1024, alias="MaxPublishBytesInFlight", ge=64 * 1024
    )
    max_publishes_in_flight: int = Field(10_000, alias="MaxPublishesInFlight", ge=1)
    publish_timeout: Seconds = Field(30.0, alias="PublishTimeout", gt=0)
    tls: TLSConfig | None = Field(None, alias="TLS")

    _check_listen = field_validator("listen")(check_listen)


class AuthenticationConfig(Strict):
    """Who may log on to the gateway (docs/security.md). Nobody, unless one of these is
    set: a users file of salted password hashes (`amps-kafka users`), the subject (CN) of
    a client certificate the gateway's TLS CA signed, or Anonymous: true."""

    anonymous: bool = Field(False, alias="Anonymous")
    users_file: Path | None = Field(None, alias="UsersFile")
    client_certificate: bool = Field(False, alias="ClientCertificate")
    # A failed logon makes the next attempts for its user and from its address wait
    # FailureDelay, doubled per further failure, up to MaxFailureDelay.
    failure_delay: Seconds = Field(0.5, alias="FailureDelay", ge=0)
    max_failure_delay: Seconds = Field(30.0, alias="MaxFailureDelay", ge=0)
    # What the gateways of one group log on to each other with (server/peers.py); the
    # same on every worker. ${env:NAME} and ${file:PATH} are resolved at load.
    peer_secret: SecretStr | None = Field(None, alias="PeerSecret")

    @field_validator("peer_secret", mode="before")
    @classmethod
    def _resolve_secret(cls, value: object) -> object:
        if not isinstance(value, str):
            return value
        secret = resolve_all({"PeerSecret": value})["PeerSecret"]
        if len(secret) < 16:
            raise ValueError("PeerSecret must be at least 16 characters")
        return secret


def check_topic_pattern(pattern: str) -> str:
    """A topic name (literal), else a regular expression over whole names, in RE2 syntax
    (as AMPS reads a topic with regex characters as a regex)."""
    if TOPIC_NAME.match(pattern):
        return pattern
    try:
        compile_pattern(pattern)
    except PatternError as exc:
        raise ValueError(
            f"{pattern!r} is neither a topic name nor a regular expression: {exc}"
        ) from None
    return pattern


class ReadGrant(Strict):
    """Read access to the topics a name or regex covers, limited by an entitlement filter."""

    topic: str = Field(alias="Topic")
    filter: str | None = Field(None, alias="Filter")

    _check_topic = field_validator("topic")(check_topic_pattern)

    @classmethod
    def parse(cls, value: object) -> object:
        return {"Topic": value} if isinstance(value, str) else value

    _check_filter = field_validator("filter")(check_filter)


class Permissions(Strict):
    """A user's or a role's grants: Read (topics or queues, each with an optional
    entitlement filter) and Write (topics or queues); a user's also its Roles."""

    roles: tuple[str, ...] = Field((), alias="Roles")
    read: tuple[Annotated[ReadGrant, BeforeValidator(ReadGrant.parse)], ...] = Field(
        (), alias="Read"
    )
    write: tuple[str, ...] = Field((), alias="Write")

    _check_write = field_validator("write")(
        lambda value: tuple(check_topic_pattern(v) for v in value)
    )


class EntitlementsConfig(Strict):
    """Who may do what (docs/security.md). Without this section every user who logs on
    may do everything; with it, only what Users (or their Roles) grant, and Default grants
    a user who has no entry."""

    roles: dict[str, Permissions] = Field(default_factory=dict, alias="Roles")
    users: dict[str, Permissions] = Field(default_factory=dict, alias="Users")
    default: Permissions | None = Field(None, alias="Default")

    @model_validator(mode="after")
    def _roles_exist(self) -> EntitlementsConfig:
        for name, role in self.roles.items():
            if role.roles:
                raise ValueError(f"Roles.{name}: a role can't have Roles of its own")
        holders = {**self.users, **({"Default": self.default} if self.default else {})}
        for name, permissions in holders.items():
            unknown = [r for r in permissions.roles if r not in self.roles]
            if unknown:
                raise ValueError(f"{name}: unknown role(s) {unknown} (define them under Roles)")
        return self


class AdminConfig(Strict):
    """The worker's admin HTTP port (docs/operations.md, Metrics and admin): Prometheus
    metrics, /health, /ready, the /admin view and the status page. Off unless Listen is
    set: it tells anyone who can reach it the worker's clients and topics."""

    listen: str | None = Field(None, alias="Listen")
    # /ready answers 503 while any owned partition is more records than this behind its
    # log end: a load balancer sends no clients to a worker still catching up.
    ready_max_lag: int = Field(1000, alias="ReadyMaxLag", ge=0)
    # Who may read it (HTTP Basic, as they log on to the gateway); None: every user who
    # may log on. /admin names every client, user and subscription filter: with
    # Entitlements, a user entitled to nothing could read them all.
    users: list[str] | None = Field(None, alias="Users")

    @field_validator("listen")
    @classmethod
    def _check_listen(cls, value: str | None) -> str | None:
        return None if value is None else check_listen(value)


# Kafka Streams' default for its RocksDB stores. RocksDB's own 64 MiB applied the SOW
# benchmark about 10% slower: inserts into a smaller memtable stay in the CPU caches.
DEFAULT_WRITE_BUFFER_BYTES = 16 * 1024 * 1024


class StateConfig(Strict):
    """The worker's RocksDB stores. Their write-ahead log is off (the Kafka log is the
    log): what a crash makes the worker re-apply is what was written since the last
    flush, which comes when a memtable fills or FlushEvery has passed."""

    write_buffer_bytes: int = Field(
        DEFAULT_WRITE_BUFFER_BYTES, alias="WriteBufferBytes", ge=64 * 1024
    )
    flush_every: Seconds = Field(30.0, alias="FlushEvery", gt=0)


class WorkerConfig(Strict):
    """The worker process itself."""

    # A summary line (applied records, lag, sessions, errors) every this often: a worker
    # that runs fine logs little else, and its log should still show it is alive.
    summary_every: Seconds = Field(60.0, alias="SummaryEvery", gt=0)
    # Static group membership (docs/scaling.md): a worker restarted with the same
    # InstanceId takes its partitions back at once, with no rebalance. Each worker of a
    # group needs its own (the --instance-id option overrides it).
    instance_id: str | None = Field(None, alias="InstanceId", min_length=1, max_length=249)
    # How long the group waits for a silent worker before its partitions move. Kafka
    # brokers refuse less than their group.min.session.timeout.ms (6 s by default; the
    # project's local broker allows 1 s).
    session_timeout: Seconds = Field(6.0, alias="SessionTimeout", ge=1, le=1800)
    # Standby replicas (docs/scaling.md): also apply the partitions other workers own,
    # so one that moves here serves within a moment instead of replaying its log.
    standby: bool = Field(False, alias="Standby")


class Config(Strict):
    """A whole configuration file."""

    kafka: KafkaConfig = Field(default_factory=KafkaConfig, alias="Kafka")
    topics: tuple[TopicConfig, ...] = Field((), alias="Topics")
    sow: tuple[SowConfig, ...] = Field((), alias="SOW")
    gateway: GatewayConfig = Field(default_factory=GatewayConfig, alias="Gateway")
    admin: AdminConfig = Field(default_factory=AdminConfig, alias="Admin")
    authentication: AuthenticationConfig = Field(
        default_factory=AuthenticationConfig, alias="Authentication"
    )
    entitlements: EntitlementsConfig | None = Field(None, alias="Entitlements")
    state: StateConfig = Field(default_factory=StateConfig, alias="State")
    worker: WorkerConfig = Field(default_factory=WorkerConfig, alias="Worker")
    queues: tuple[QueueConfig, ...] = Field((), alias="Queues")

    @model_validator(mode="after")
    def _sow_topics_are_log_topics(self) -> Config:
        names = [t.name for t in self.topics]
        if len(set(names)) != len(names):
            raise ValueError(f"Topics: a Name appears twice in {names}")
        for sow in self.sow:
            if sow.topic not in names:
                raise ValueError(f"SOW topic {sow.topic!r} is not one of Topics {names}")
        sow_topics = [sow.topic for sow in self.sow]
        if len(set(sow_topics)) != len(sow_topics):  # one would be ignored: which Key holds?
            raise ValueError(f"SOW: a Topic appears twice in {sow_topics}")
        return self

    @model_validator(mode="after")
    def _admin_port_is_not_the_gateways(self) -> Config:
        """One worker binds both: the same address failed its start with the gateway's
        'address already in use', its own admin port holding it."""
        admin = self.admin.listen
        if admin is not None and same_port(admin, self.gateway.listen):
            raise ValueError(
                f"Admin.Listen {admin!r} takes the port of Gateway.Listen "
                f"{self.gateway.listen!r}: give the admin port another"
            )
        return self

    @model_validator(mode="after")
    def _client_certificates_need_a_ca(self) -> Config:
        """Without Gateway.TLS.CA the gateway asks for no client certificate, so
        ClientCertificate would let nobody in, and say nothing."""
        tls = self.gateway.tls
        if self.authentication.client_certificate and (tls is None or tls.ca is None):
            raise ValueError(
                "Authentication.ClientCertificate needs Gateway.TLS with a CA (the CA that "
                "signs the client certificates)"
            )
        return self

    def topic(self, name: str) -> TopicConfig | None:
        return next((t for t in self.topics if t.name == name), None)

    def sow_for(self, name: str) -> SowConfig | None:
        return next((s for s in self.sow if s.topic == name), None)

    @model_validator(mode="after")
    def _queue_names_unique(self) -> Config:
        names = [q.name for q in self.queues]
        if len(set(names)) != len(names):
            raise ValueError(f"Queues: a Name appears twice in {names}")
        return self

    @model_validator(mode="after")
    def _dead_letters_are_not_read_again(self) -> Config:
        """A DeadLetterTopic that a SOW or a queue of this config reads has its letters
        read again as records: refused (or enqueued, and expired) and written again, in a
        loop when the reader wrote them (one bad record wrote 117 letters in 5 s into a
        SOW topic that was its own DeadLetterTopic)."""
        read = {sow.topic for sow in self.sow}
        sections = [(f"SOW {sow.topic}", sow) for sow in self.sow]
        sections += [(f"queue {queue.name}", queue) for queue in self.queues]
        for owner, section in sections:
            target = section.dead_letter_topic
            readers = [f"SOW {target}"] if target in read else []
            readers += [f"queue {q.name}" for q in self.queues if target and q.views(target)]
            if readers:
                raise ValueError(
                    f"{owner}: DeadLetterTopic {target!r} is read by {', '.join(readers)}: "
                    "letters must go to a topic nothing here reads (a letter read again is "
                    "refused or enqueued again, in a loop)"
                )
        return self

    def queue(self, name: str) -> QueueConfig | None:
        return next((q for q in self.queues if q.name == name), None)

    def publish_target(self, topic: str) -> str:
        """The log topic a publish to `topic` is written to (seed 001's routing table).

        A publish to a queue's name goes to its DefaultPublishTarget; any other topic is
        written as named.
        """
        queue = self.queue(topic)
        if queue is None or queue.publish_target is None:
            return topic
        if not queue.enqueues_publishes_to_its_name:
            raise ConfigError(
                f"publish to queue {topic!r}: its DefaultPublishTarget "
                f"{queue.publish_target!r} does not match {queue.underlying}, "
                "so the message would never be enqueued; publish "
                "to an underlying topic, or configure a DefaultPublishTarget that matches"
            )
        return queue.publish_target

    def queues_viewing(self, topic: str) -> list[QueueConfig]:
        """The queues that enqueue a message written to the log topic `topic`."""
        return [q for q in self.queues if q.views(topic)]
