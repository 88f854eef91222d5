"""Issue 15 benchmarks: several workers, one service.

    python -m bench scaling [--per-partition 100000] [--session-timeout 2]

- failover: two workers share a 4-partition topic holding `--per-partition` distinct
  keys per partition; one is SIGKILLed. Measured: from the kill until a query through
  the other gateway is answered in full (its partitions moved, were restored, and
  announced), with the session timeout given; then the same with the killed worker
  restarted at once on its state directory with its instance id (static membership:
  no wait for the session timeout). Both without and with standby copies.
- apply: the same topic restored by 1, 2 and 4 workers of a new group on empty state
  directories, from launch until every partition serves, as records per second and
  the ratio to one worker.
- restore (`--restore-only` for this case alone), on a topic of its own with as many
  records, each key published VERSIONS times (the SOW holds a quarter of the log): one
  worker on an empty state directory replays the topic from EPOCH without a changelog,
  then with `Changelog: true` (what writing the changelog costs), then a second worker
  of that group, on an empty state directory, restores every partition from the
  changelog instead of the log. Each from launch until served.

Workers run as `amps-kafka worker` processes (tests/scaling/workers.py), as deployed.
"""

from __future__ import annotations

import argparse
import tempfile
import time
import uuid
from pathlib import Path

from confluent_kafka import OFFSET_BEGINNING, Producer, TopicPartition
from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource, ResourceType

from amps_on_kafka.client import Client
from amps_on_kafka.errors import AmpsError
from amps_on_kafka.log.kafka import admin_client, consume_available, reader
from amps_on_kafka.log.publisher import LogPublisher
from amps_on_kafka.processor.changelog import changelog_topic
from bench.common import bootstrap, new_topic
from tests.scaling.workers import WorkerProcess, write_config

PARTITIONS = 4
VERSIONS = 4  # times each key is published in the restore case's topic
WAIT = 600.0  # seconds any step may take before the benchmark gives up


def fill(servers: str, topic: str, count: int, versions: int = 1) -> None:
    """`count` records: count / versions keys, each published `versions` times."""
    publisher = LogPublisher(servers, "bench-scaling", report_successes=False)
    keys = count // versions
    for version in range(versions):
        for key in range(keys):
            publisher.publish(topic, {"id": key, "v": version, "pad": "x" * 150})
    publisher.flush(300)


def served(address: str, topic: str) -> float:
    """When a query through `address` is first answered for the whole topic (a one-record
    answer is complete only if every partition serves: otherwise retry:)."""
    deadline = time.monotonic() + WAIT
    with Client(f"bench-{uuid.uuid4().hex[:6]}") as client:
        client.connect(address)
        client.logon(30)
        while time.monotonic() < deadline:
            try:
                list(client.sow(topic, top_n=1, timeout=60))
                return time.monotonic()
            except AmpsError as exc:
                if not exc.reason.startswith("retry:"):
                    raise
            time.sleep(0.05)
    raise TimeoutError(f"{topic} not served through {address} within {WAIT}s")


def group_of(count: int, config: Path, servers: str, base: Path) -> list[WorkerProcess]:
    group = f"bench-scaling-{uuid.uuid4().hex[:8]}"
    return [WorkerProcess(f"w{i}", config, servers, group, base) for i in range(count)]


def apply_rate(servers: str, topic: str, records: int, workers: int, base: Path) -> float:
    config = write_config(base / "worker.yaml", topic, PARTITIONS, 6.0)
    group = group_of(workers, config, servers, base)
    try:
        started = time.monotonic()
        for worker in group:
            worker.start()
        address = group[0].wait_ready(WAIT)
        return records / (served(address, topic) - started)
    finally:
        for worker in group:
            worker.stop()


def restore_rates(servers: str, records: int, base: Path) -> None:
    """Prints the replay from EPOCH without and with a changelog, and the restore from
    the changelog, each as seconds and log records per second from launch until served."""
    topic = new_topic(servers, "changelog", PARTITIONS, key=("/id",))
    fill(servers, topic, records, VERSIONS)
    timeout = 2.0
    base.mkdir(parents=True)
    for changelog in (False, True):
        config = write_config(
            base / f"c{changelog}.yaml", topic, PARTITIONS, timeout, False, changelog
        )
        group = group_of(1, config, servers, base / f"replay-{changelog}")
        took = launch_to_served(group[0], topic)
        print(
            f"{records:,} log records ({records // VERSIONS:,} keys) replayed from EPOCH, "
            f"Changelog {changelog}: {took:.1f}s, {records / took:,.0f} log records/s",
            flush=True,
        )
    name = group[0].group
    for compacted in (False, True):
        if compacted:
            held = compact(servers, changelog_topic(name, topic), records // VERSIONS)
            print(f"changelog compacted to {held:,} records", flush=True)
        time.sleep(timeout * 2)  # the stopped static member leaves the group by its timeout
        restorer = WorkerProcess(f"r{compacted:d}", config, servers, name, base / "restore")
        took = launch_to_served(restorer, topic)
        print(
            f"restored from the changelog ({'compacted' if compacted else 'as written'}) on an "
            f"empty state directory: {took:.1f}s, {records / took:,.0f} log records/s "
            f"({records // VERSIONS / took:,.0f} SOW records/s)",
            flush=True,
        )


def compact(servers: str, changelog: str, keys: int) -> int:
    """Have Kafka compact the changelog now (by default it compacts only segments closed
    after segment.ms, 7 days, or 1 GiB): short segments, a tombstone-free marker write
    to close them, then wait for the cleaner (log.cleaner.backoff.ms, 15 s). Returns the
    records it then holds."""
    admin = admin_client(servers)
    entries = [
        ConfigEntry(name, value, incremental_operation=AlterConfigOpType.SET)
        for name, value in {"segment.ms": "500", "min.cleanable.dirty.ratio": "0.01"}.items()
    ]
    resource = ConfigResource(ResourceType.TOPIC, changelog, incremental_configs=entries)
    admin.incremental_alter_configs([resource])[resource].result(30)
    deadline = time.monotonic() + WAIT
    while (held := changelog_records(servers, changelog)) > keys * 1.1:
        if time.monotonic() > deadline:
            raise TimeoutError(f"{changelog} not compacted within {WAIT}s")
        roll(servers, changelog)
        time.sleep(5)
    return held


def roll(servers: str, changelog: str) -> None:
    """An aborted transaction on each partition: it appends (closing a segment older than
    segment.ms) and restores nothing."""
    producer = Producer({"bootstrap.servers": servers, "transactional.id": uuid.uuid4().hex})
    producer.init_transactions(30)
    producer.begin_transaction()
    for partition in range(PARTITIONS):
        producer.produce(changelog, b"", b"roll", partition)
    producer.flush(30)
    producer.abort_transaction(30)


def changelog_records(servers: str, changelog: str) -> int:
    consumer = reader(servers, **{"enable.partition.eof": True})
    consumer.assign([TopicPartition(changelog, p, OFFSET_BEGINNING) for p in range(PARTITIONS)])
    count, ends = 0, 0
    try:
        while ends < PARTITIONS:
            for message in consume_available(consumer, 10_000, 10):
                if message.error():
                    ends += 1
                else:
                    count += 1
    finally:
        consumer.close()
    return count


def launch_to_served(worker: WorkerProcess, topic: str) -> float:
    """Seconds from the worker's launch until a query is answered in full."""
    worker.state.parent.mkdir(parents=True, exist_ok=True)
    try:
        started = time.monotonic()
        address = worker.start().wait_ready(WAIT)
        return served(address, topic) - started
    finally:
        worker.stop()


def failover(servers: str, topic: str, session_timeout: float, base: Path, standby: bool) -> float:
    """Prints the seconds until served through the other gateway after a kill; returns
    those until served again after a kill and an immediate restart."""
    config = write_config(base / "worker.yaml", topic, PARTITIONS, session_timeout, standby)
    group = group_of(2, config, servers, base)
    try:
        for worker in group:
            worker.start()
        addresses = [worker.wait_ready(WAIT) for worker in group]
        served(addresses[1], topic)
        killed = time.monotonic()
        group[0].kill()
        moved = served(addresses[1], topic) - killed
        print(
            f"failover, SessionTimeout {session_timeout:g}s, Standby {standby}: served by "
            f"the other worker {moved:.1f}s after the kill",
            flush=True,
        )
        served(addresses[1], topic)
        group[0].start()  # back alone: it takes partitions of w1's now
        group[0].wait_ready(WAIT)
        served(group[0].address, topic)  # type: ignore[arg-type]
        killed = time.monotonic()
        group[0].kill()
        group[0].start()
        back = served(group[0].wait_ready(WAIT), topic) - killed
        return back
    finally:
        for worker in group:
            worker.stop()


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench scaling")
    parser.add_argument("--per-partition", type=int, default=100_000)
    parser.add_argument("--session-timeout", type=float, default=2.0)
    parser.add_argument("--no-apply", action="store_true", help="failover figures only")
    parser.add_argument("--restore-only", action="store_true", help="the restore case only")
    args = parser.parse_args(argv)
    servers = bootstrap()
    records = args.per_partition * PARTITIONS
    with tempfile.TemporaryDirectory(prefix="bench-scaling-") as tmp:
        restore_rates(servers, records, Path(tmp) / "restore")
        if args.restore_only:
            return
        topic = new_topic(servers, "scaling", PARTITIONS, key=("/id",))
        fill(servers, topic, records)
        print(f"{topic}: {records:,} records, {args.per_partition:,} keys per partition")
        for standby in (False, True):
            base = Path(tmp) / f"failover-{standby}"
            base.mkdir()
            back = failover(servers, topic, args.session_timeout, base, standby)
            print(
                f"kill and restart (static membership), Standby {standby}: served again "
                f"{back:.1f}s after the kill",
                flush=True,
            )
        rates = {}
        for workers in () if args.no_apply else (1, 2, 4):
            base = Path(tmp) / f"apply{workers}"
            base.mkdir(parents=True)
            rates[workers] = apply_rate(servers, topic, records, workers, base)
            print(
                f"apply with {workers} worker(s): {rates[workers]:,.0f} records/s "
                f"(x{rates[workers] / rates[1]:.2f} of one worker), launch to served"
            )


if __name__ == "__main__":
    import sys

    main(sys.argv[1:])
