"""Hardening benchmark: another session's heartbeats while one client scans the whole SOW,
and while subscriptions with a costly filter receive big changes.

    python -m bench fairness [--records 1000000] [--filter "/qty > 500"]
                             [--big-changes 20] [--change-bytes 500000] [--subscribers 2]

A worker and its gateway run in this process; scanning, subscribing, publishing and
heartbeating clients run in spawned processes of their own, as applications would.
Heartbeats go out every 5 ms for as long as the scan (or the subscriptions' deliveries)
run; the benchmark reports their latency (p50, p99, max) against the 50 ms target, for a
filtered scan, a scan ordered by a field (a sort of every record), a scan whose LIKE
pattern is catastrophic for a backtracking engine, and subscriptions whose filter is about
as costly as a legal one can be (20 large LIKE patterns that fail on random letters) while
changes of half a megabyte are published. The scan's rate is reported beside raw
confluent-kafka consuming the same log in the same run.
"""

from __future__ import annotations

import argparse
import multiprocessing
import random
import string
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from typing import Any

from amps_on_kafka.client import Client
from amps_on_kafka.processor.collections import freeze_long_lived
from bench.common import Result, bootstrap, documents, new_topic, report
from bench.gateway import percentile, serve
from bench.log import raw_consume
from bench.sow import fill

TARGET_MS = 50.0
PACE = 0.005  # seconds between heartbeats
#: 20 LIKE patterns of a large RE2 program each, which fail on random letters, then a
#: condition every record meets: a subscription evaluates all of them for every change.
COSTLY = " OR ".join(f"/note LIKE '{c}.{{30}}{c}0'" for c in string.ascii_lowercase[:20])
COSTLY += " OR /id >= 0"


def scan(address: str, topic: str, filter: str, order_by: str | None, started: Any) -> tuple:
    """Wall-clock start and end of one sow query, and how many records it delivered."""
    with Client("bench-scan") as client:
        client.connect(f"tcp://{address}/amps/json")
        client.logon()
        started.set()
        start = time.time()
        delivered = sum(1 for _ in client.sow(topic, filter, order_by=order_by, batch_size=500))
        return start, time.time(), delivered


def heartbeats(address: str, started: Any, done: Any) -> list[tuple[float, float]]:
    """(sent at, seconds to the answer) for heartbeats every PACE until `done` is set."""
    with Client("bench-heartbeats") as client:
        client.connect(f"tcp://{address}/amps/json")
        client.logon()
        started.wait(60)
        samples = []
        while not done.is_set():
            sent = time.time()
            client.heartbeat()
            samples.append((sent, time.time() - sent))
            time.sleep(PACE)
        return samples


def measure(pool: ProcessPoolExecutor, manager: Any, address: str, topic: str, **query: Any):
    started, done = manager.Event(), manager.Event()
    beats = pool.submit(heartbeats, address, started, done)
    try:
        start, end, delivered = pool.submit(scan, address, topic, started=started, **query).result()
    finally:
        done.set()
    during = [latency for sent, latency in beats.result() if start <= sent <= end]
    return end - start, delivered, during


def subscriber(address: str, topic: str, count: int, started: Any) -> float:
    """Receive `count` changes on a subscription with the COSTLY filter; when done."""
    with Client(f"bench-subscriber-{random.randrange(1 << 30)}") as client:
        client.connect(f"tcp://{address}/amps/json")
        client.logon()
        stream = client.subscribe(topic, COSTLY)
        started.set()
        for received, _ in enumerate(stream, 1):
            if received == count:
                break
        return time.time()


def publish_big(servers: str, topic: str, count: int, size: int) -> float:
    """`count` changes with a `note` of `size` random letters; when the first was sent."""
    rng = random.Random(3)
    with Client("bench-big-publisher") as client:
        client.connect(f"kafka://{servers}")
        client.logon()
        start = time.time()
        for i in range(count):
            note = "".join(rng.choices(string.ascii_lowercase, k=size))
            client.publish(topic, {"id": f"big-{i}", "note": note})
        client.publish_flush(120)
        return start


def measure_subscriptions(
    pool: ProcessPoolExecutor, manager: Any, servers: str, address: str, topic: str, args: Any
) -> tuple[float, list[float]]:
    """Heartbeat latencies while `args.subscribers` costly subscriptions get big changes."""
    ready = [manager.Event() for _ in range(args.subscribers)]
    started, done = manager.Event(), manager.Event()
    beats = pool.submit(heartbeats, address, started, done)
    subscribed = [pool.submit(subscriber, address, topic, args.big_changes, r) for r in ready]
    try:
        for event in ready:
            event.wait(60)
        started.set()
        start = pool.submit(publish_big, servers, topic, args.big_changes, args.change_bytes)
        start_at = start.result()
        end = max(future.result() for future in subscribed)
    finally:
        done.set()
    return end - start_at, [lat for sent, lat in beats.result() if start_at <= sent <= end]


def describe(label: str, seconds: float, delivered: int, during: list[float]) -> None:
    if not during:
        print(f"{label:<48} no heartbeat fell inside the {seconds:.2f} s scan", flush=True)
        return
    worst = max(during) * 1e3
    print(
        f"{label:<48} scan {seconds:.2f} s ({delivered:,} delivered); {len(during)} heartbeats "
        f"meanwhile: p50 {percentile(during, 0.5) * 1e3:.1f} ms, p99 "
        f"{percentile(during, 0.99) * 1e3:.1f} ms, max {worst:.1f} ms  "
        f"(target {TARGET_MS:.0f} ms: {'met' if worst <= TARGET_MS else 'MISSED'})",
        flush=True,
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench fairness")
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--filter", default="/qty > 500")
    parser.add_argument("--big-changes", type=int, default=20, help="0: no subscription run")
    parser.add_argument("--change-bytes", type=int, default=500_000)
    parser.add_argument("--subscribers", type=int, default=2)
    args = parser.parse_args(argv)
    servers = bootstrap()
    topic = new_topic(servers, "fairness", 1, key=("/id",))
    fill(servers, topic, documents(args.records, args.records))
    peer = raw_consume(servers, topic, 1, args.records)
    spawn = multiprocessing.get_context("spawn")  # never fork a process holding RocksDB
    with tempfile.TemporaryDirectory() as state, spawn.Manager() as manager:
        worker, gateway = serve(servers, topic, state)
        freeze_long_lived()  # as the worker command does once it serves
        try:
            workers = max(2, args.subscribers + 2)
            with ProcessPoolExecutor(max_workers=workers, mp_context=spawn) as pool:
                queries = [
                    (f"filtered scan {args.filter!r}", args.filter, None),
                    ("filtered scan, ordered by /px", args.filter, "/px"),
                    ("catastrophic LIKE '(x+x+)+y' on /note", "/note LIKE '(x+x+)+y'", None),
                ]
                for label, filter, order_by in queries:
                    seconds, delivered, during = measure(
                        pool, manager, gateway.address, topic, filter=filter, order_by=order_by
                    )
                    describe(label, seconds, delivered, during)
                    if order_by is None and delivered:
                        ours = Result("gateway", seconds, args.records)
                        report(f"  records scanned, {args.records:,}", ours, peer)
                if args.big_changes:
                    seconds, during = measure_subscriptions(
                        pool, manager, servers, gateway.address, topic, args
                    )
                    label = (
                        f"{args.subscribers} costly subscriptions, {args.big_changes} changes "
                        f"of {args.change_bytes / 1e6:g} MB"
                    )
                    delivered = args.big_changes * args.subscribers
                    describe(label, seconds, delivered, during)
        finally:
            gateway.stop()
            worker.stop()


if __name__ == "__main__":
    main()
