"""Issue 5 queue benchmarks: queue messages delivered and acknowledged through the gateway.

    python -m bench queues [--messages 100000] [--subscribers 4] [--backlog 1000]
                           [--ack-batch BACKLOG/2] [--partitions 1] [--lease-samples 5]
                           [--share-lease] [--unbatched]

Workload: an at-least-once queue, SUBSCRIBERS subscribers with max_backlog BACKLOG, 200
bytes of JSON per message. The queue engine and its gateway run in this process; each
subscriber (a tcp:// client) is a spawned process of its own, as applications are, and
so is the publisher. Each subscriber decodes every message and acks it (batched by the
client, ACK_BATCH bookmarks per sow_delete) and asks for batched delivery (option
`batch`: a burst of deliveries in one frame; --unbatched: a frame per message). The
rate is messages read from Kafka, delivered, acknowledged and removed per second, from
the first delivery until the queue is empty (after an unmeasured run of WARM_UP
messages), beside, in the same run and on the same broker:

- raw confluent-kafka consuming (and decoding) the same messages from the log;
- Kafka's own queues, KIP-932 share groups: SUBSCRIBERS ShareConsumers with
  `max.poll.records` BACKLOG, acknowledging every record explicitly and committing the
  acknowledgements once a poll. The target is set against the same workload as ours:
  the consumers are in the group (warmed up) on an empty topic, a publisher process of
  its own publishes the messages meanwhile, and the clock runs from the first record
  taken. Until the ninth round the share consumers read a topic filled before they
  started while ours ran beside its publisher; that figure is still printed below it
  (no target), so the change of workload is visible in every run.

Like with like: both sides get the same allowance of messages in flight, BACKLOG (1000)
a subscriber, and acknowledge in batches. A share consumer's `max.poll.records` is a
soft limit: the broker acquires whole record batches per ShareFetch (KIP-1206's
default), and librdkafka's ShareConsumer has no `share.acquire.mode` to make it strict;
measured here, polls with `max.poll.records` 10 brought ~4,650 records each. So the
share consumers are never limited below what the broker gives them (no peer throttled),
the run prints how many records their polls really brought, and ours get a backlog of
1000 with acks batched by half of it (one sow_delete a half backlog, the other half in
hand meanwhile). Until issue 18's third round the default was max_backlog 10, acks by
5, against share consumers that held thousands: a round trip every 5 messages on our
side only.

Then the lease-expiry redelivery lag: how long after its lease runs out a message that
was never acknowledged reaches a subscriber again (--share-lease measures the share
group's too; the broker allows no record lock shorter than 15 s, so it is opt-in).
"""

from __future__ import annotations

import argparse
import itertools
import multiprocessing
import statistics
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass

import orjson
from confluent_kafka import ShareConsumer
from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource
from confluent_kafka.admin import ResourceType as Resource

from amps_on_kafka.client import Client
from amps_on_kafka.config import Config
from amps_on_kafka.log.kafka import log_producer
from amps_on_kafka.processor.collections import freeze_long_lived
from amps_on_kafka.processor.engine import SowEngine
from amps_on_kafka.processor.queue_runtime import now_ms
from amps_on_kafka.processor.queues import QueueEngine
from amps_on_kafka.server.gateway import Gateway
from bench.common import Result, bootstrap, documents, encoded_size, new_topic, report
from bench.log import raw_consume

TARGET_RATE = 20_000  # messages per second, the target
SHARE_TARGET = 0.5  # issue 18: at least half the rate of Kafka's share groups
IDLE = 10.0  # seconds a subscriber waits for a message before it gives up
WARM_UP = 10_000  # messages of ours' unmeasured first run


# -- shared pieces ---------------------------------------------------------------------
def produce(servers: str, topic: str, count: int) -> None:
    """Publish `count` documents with the project's producer settings (acks=all)."""
    producer = log_producer(servers)
    for doc in documents(count):
        while True:
            try:
                producer.produce(topic, orjson.dumps(doc))
                break
            except BufferError:
                producer.poll(0.05)
    assert producer.flush(120) == 0


def queue_config(topic: str, backlog: int, lease: str) -> Config:
    return Config.model_validate(
        {
            "Topics": [{"Name": topic}],
            "Queues": [{"Name": topic, "LeasePeriod": lease, "MaxPerSubscriptionBacklog": backlog}],
        }
    )


def serve(servers: str, config: Config, state: str) -> tuple[QueueEngine, Gateway, str]:
    engine = QueueEngine(config, servers, state)
    engine.start()
    engine.wait_ready()
    gateway = Gateway(SowEngine(Config(), {}, now_ms), servers, listen="127.0.0.1:0", queues=engine)
    return engine, gateway, gateway.start()


# -- ours: each subscriber an application of its own (a spawned process) -------------------
def subscriber(address, queue, backlog, ack_batch, batch, subscribed, firsts) -> None:
    """Decode and ack every message delivered, until the benchmark ends this process."""
    options = f"max_backlog={backlog},batch" if batch else f"max_backlog={backlog}"
    with Client(f"bench-sub-{uuid.uuid4().hex[:6]}") as client:
        client.connect(f"tcp://{address}/amps/json")
        client.logon()
        client.set_ack_batch_size(ack_batch)
        client.set_ack_timeout(0.002)
        stream = client.subscribe(queue, options=options)
        subscribed.wait()
        first = True
        for message in stream:
            if first:
                firsts.put(time.time())
                first = False
            message.data  # noqa: B018 - decode, as an application would
            message.ack()


def ours(servers: str, topic: str, count: int, args: argparse.Namespace) -> Result:
    """From the first delivery until every message is read, delivered, acked and removed."""
    spawn = multiprocessing.get_context("spawn")  # never fork a process that opened RocksDB
    with tempfile.TemporaryDirectory() as state:
        engine, gateway, address = serve(servers, queue_config(topic, args.backlog, "60s"), state)
        subscribed, firsts = spawn.Barrier(args.subscribers + 1), spawn.Queue()
        batch = not args.unbatched
        options = (address, topic, args.backlog, args.ack_batch, batch, subscribed, firsts)
        apps = [spawn.Process(target=subscriber, args=options) for _ in range(args.subscribers)]
        try:
            for app in apps:
                app.start()
            subscribed.wait(60)
            publisher = spawn.Process(target=produce, args=(servers, topic, count))
            publisher.start()
            queue = engine.runtimes[topic].state
            while not (queue.depth == 0 and sum(queue.positions.values()) >= count):
                time.sleep(0.002)
            finished = time.time()
            first = min(firsts.get(timeout=10) for _ in apps)
            publisher.join(30)
        finally:
            for app in apps:
                app.terminate()  # every message is acknowledged: nothing is lost
                app.join(10)
            gateway.stop()
            engine.stop()
    return Result("queue", finished - first, count)


# -- Kafka share groups --------------------------------------------------------------------
def share_group(servers: str, lock_ms: int | None = None) -> str:
    """A share group that starts at the beginning of the log (the default is the end)."""
    group = f"bench-share-{uuid.uuid4().hex[:8]}"
    entries = [
        ConfigEntry(
            "share.auto.offset.reset", "earliest", incremental_operation=AlterConfigOpType.SET
        )
    ]
    if lock_ms is not None:
        entries.append(
            ConfigEntry(
                "share.record.lock.duration.ms",
                str(lock_ms),
                incremental_operation=AlterConfigOpType.SET,
            )
        )
    resource = ConfigResource(Resource.GROUP, group, incremental_configs=entries)
    admin = AdminClient({"bootstrap.servers": servers})
    admin.incremental_alter_configs([resource])[resource].result()
    return group


def share_consumer(servers: str, group: str, topic: str, records: int, mode: str = "explicit"):
    consumer = ShareConsumer(
        {
            "bootstrap.servers": servers,
            "group.id": group,
            "share.acknowledgement.mode": mode,
            "max.poll.records": records,
        }
    )
    consumer.subscribe([topic])
    return consumer


@dataclass
class ShareResult(Result):
    records_a_poll: float  # what the broker really gave a poll (max.poll.records is soft)


def share_run(
    servers: str, topic: str, count: int, args: argparse.Namespace, live: bool = False
) -> ShareResult:
    """SUBSCRIBERS share consumers (max.poll.records BACKLOG, a soft limit), in threads.

    `live`: `topic` is empty and the consumers read while a publisher process of its own
    publishes `count` messages, as ours() does: first every consumer is warmed up (it has
    taken a record of a warm-up run, so the group has assigned it), then the publisher
    starts and the clock runs from the first record it published. Otherwise `topic`
    already holds `count` messages."""
    group = share_group(servers)
    lock = threading.Lock()
    tally = {"acked": 0, "first": None, "polls": 0}
    warm = [0] * args.subscribers  # records each consumer took before the measured ones
    measuring = threading.Event()
    done = threading.Event()
    if not live:
        measuring.set()

    def consume(index: int) -> None:
        consumer = share_consumer(servers, group, topic, args.backlog)
        try:
            while not done.is_set():
                batch = consumer.poll(0.2)
                if not batch:
                    continue
                for record in batch:
                    orjson.loads(record.value())
                    consumer.acknowledge(record)
                consumer.commit_async()
                if not measuring.is_set():
                    with lock:
                        warm[index] += len(batch)
                    continue
                with lock:
                    tally["first"] = tally["first"] or time.perf_counter()
                    tally["acked"] += len(batch)
                    tally["polls"] += 1
                    if tally["acked"] >= count:
                        done.set()
        finally:
            consumer.close()

    threads = [threading.Thread(target=consume, args=(i,)) for i in range(args.subscribers)]
    for thread in threads:
        thread.start()
    publisher = None
    try:
        if live:
            warm_up(servers, topic, warm, lock)
            measuring.set()
            spawn = multiprocessing.get_context("spawn")
            publisher = spawn.Process(target=produce, args=(servers, topic, count))
            publisher.start()
        assert done.wait(300), f"share consumers acked {tally['acked']} of {count}"
    finally:
        done.set()
        if publisher is not None:
            publisher.join(30)
    finished = time.perf_counter()
    for thread in threads:
        thread.join()
    return ShareResult("share", finished - tally["first"], count, tally["acked"] / tally["polls"])


def warm_up(servers: str, topic: str, warm: list[int], lock: threading.Lock) -> None:
    """Publish runs of 20 records until every share consumer has taken one of them and all
    are taken: each consumer is then in the group, and none is left for the clock."""
    producer = log_producer(servers)
    sent, deadline = 0, time.monotonic() + 120
    while True:
        with lock:
            taken = list(warm)
        if min(taken) > 0 and sum(taken) == sent:
            return
        assert time.monotonic() < deadline, f"consumers took {taken} of {sent} warm-up records"
        if sum(taken) == sent:
            for doc in documents(20):
                producer.produce(topic, orjson.dumps(doc))
            sent += 20
            producer.flush(30)
        time.sleep(0.05)  # a bench's wait for consumers to catch up, not a test's sync


def lease_lag(servers: str, samples: int, lease_ms: int = 200) -> list[float]:
    """Seconds past the lease period until an unacknowledged message is delivered again."""
    topic = new_topic(servers, "queue-lease", 1)
    config = queue_config(topic, 1, f"{lease_ms}ms")
    with tempfile.TemporaryDirectory() as state:
        engine, gateway, address = serve(servers, config, state)
        try:
            with Client(f"bench-lease-{uuid.uuid4().hex[:4]}") as client:
                client.connect(f"tcp://{address}/amps/json")
                client.logon()
                with client.subscribe(topic, timeout=IDLE) as stream:
                    produce(servers, topic, 1)
                    arrivals = []
                    for _ in stream:  # never acknowledged: each lease runs out
                        arrivals.append(time.perf_counter())
                        if len(arrivals) > samples:
                            break
        finally:
            gateway.stop()
            engine.stop()
    gaps = [b - a for a, b in itertools.pairwise(arrivals)]
    return [gap - lease_ms / 1000 for gap in gaps]


def share_lease_lag(servers: str, topic: str, lock_ms: int = 15_000) -> float:
    """Seconds past the record lock until a share group redelivers what one consumer
    acquired and never acknowledged, to another consumer of the group."""
    group = share_group(servers, lock_ms)
    holder = share_consumer(servers, group, topic, 1)
    other = share_consumer(servers, group, topic, 500, mode="implicit")
    try:
        held: set[tuple[int, int]] = set()
        while not held:
            held = {(r.partition(), r.offset()) for r in holder.poll(0.5) or ()}
        acquired = time.perf_counter()  # the holder now goes quiet, as a failed consumer does
        while True:
            for record in other.poll(0.05) or ():
                if (record.partition(), record.offset()) in held:
                    return time.perf_counter() - acquired - lock_ms / 1000
    finally:
        other.close()
        holder.close()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench queues")
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--subscribers", type=int, default=4)
    parser.add_argument("--backlog", type=int, default=1000)
    parser.add_argument("--ack-batch", type=int, help="default: half the backlog")
    parser.add_argument("--partitions", type=int, default=1)
    parser.add_argument("--lease-samples", type=int, default=5)
    parser.add_argument("--share-lease", action="store_true")
    parser.add_argument(
        "--unbatched", action="store_true", help="a frame per delivery (no option batch)"
    )
    args = parser.parse_args(argv)
    args.ack_batch = args.ack_batch or max(1, args.backlog // 2)
    servers = bootstrap()
    count = args.messages
    print(
        f"# {count:,} messages of ~{encoded_size(documents(1)[0])} bytes of JSON, "
        f"{args.subscribers} subscribers, max_backlog {args.backlog}, acks batched by "
        f"{args.ack_batch}, {args.partitions} partition(s), broker {servers}"
    )
    raw_topic = new_topic(servers, "queue-raw", args.partitions)
    produce(servers, raw_topic, count)
    peer = raw_consume(servers, raw_topic, args.partitions, count)
    # What lives as long as the process (modules, clients) out of the collector's full
    # passes, as the worker command does once it serves; here, not in serve(): a test
    # process that calls ours() keeps its collector as it was.
    freeze_long_lived()
    # Unmeasured first: a fresh broker's and worker's first transactions and code paths
    # warmed, as they are for the share groups, whose runs come after ours on the broker
    # ours has warmed (and whose consumers warm up in their group before the clock).
    ours(servers, new_topic(servers, "queue-warm", args.partitions), min(count, WARM_UP), args)
    mine = ours(servers, new_topic(servers, "queue", args.partitions), count, args)
    report("queue: delivered + acked via the gateway", mine, peer)
    verdict = "met" if mine.rate >= TARGET_RATE else "MISSED"
    print(f"{'':<48} target {TARGET_RATE:,}/s: {verdict}", flush=True)
    live_topic = new_topic(servers, "queue-share", args.partitions)
    share = share_run(servers, live_topic, count, args, live=True)
    report("queue vs Kafka share groups (KIP-932)", mine, share, target=SHARE_TARGET)
    filled = share_run(servers, raw_topic, count, args)
    report("  (share groups reading a filled topic)", mine, filled)
    print(
        f"{'':<48} share polls brought {share.records_a_poll:,.0f} records each "
        f"(max.poll.records {args.backlog}); ours: max_backlog {args.backlog}",
        flush=True,
    )
    lags = lease_lag(servers, args.lease_samples)
    median, worst = statistics.median(lags) * 1000, max(lags) * 1000
    print(
        f"{'lease-expiry redelivery lag (lease 200ms)':<48} median {median:.1f} ms, "
        f"max {worst:.1f} ms over {len(lags)} redeliveries",
        flush=True,
    )
    if args.share_lease:
        lag = share_lease_lag(servers, raw_topic)
        print(
            f"{'share group redelivery lag (record lock 15s)':<48} {lag * 1000:.1f} ms", flush=True
        )


if __name__ == "__main__":
    main()
