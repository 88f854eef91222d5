"""Hardening benchmark: another session's heartbeats while one client scans the whole SOW.

    python -m bench fairness [--records 1000000] [--filter "/qty > 500"]

A worker and its gateway run in this process; a scanning client and a heartbeating client
run in spawned processes of their own, as applications would. Heartbeats go out every
5 ms for as long as the scan runs; the benchmark reports their latency (p50, p99, max)
against the 50 ms target, for a filtered scan, a scan ordered by a field (a sort of every
record) and a scan whose LIKE pattern is catastrophic for a backtracking engine. The
scan's rate is reported beside raw confluent-kafka consuming the same log in the same run.
"""

from __future__ import annotations

import argparse
import multiprocessing
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from typing import Any

from amps_on_kafka.client import Client
from bench.common import Result, bootstrap, documents, new_topic, report
from bench.gateway import percentile, serve
from bench.log import raw_consume
from bench.sow import fill

TARGET_MS = 50.0
PACE = 0.005  # seconds between heartbeats


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
    args = parser.parse_args(argv)
    servers = bootstrap()
    topic = new_topic(servers, "fairness", 1, key=("/id",))
    fill(servers, topic, documents(args.records, args.records))
    peer = raw_consume(servers, topic, 1, args.records)
    spawn = multiprocessing.get_context("spawn")  # never fork a process holding RocksDB
    with tempfile.TemporaryDirectory() as state, spawn.Manager() as manager:
        worker, gateway = serve(servers, topic, state)
        try:
            with ProcessPoolExecutor(max_workers=2, mp_context=spawn) as pool:
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
        finally:
            gateway.stop()
            worker.stop()


if __name__ == "__main__":
    main()
