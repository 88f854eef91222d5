"""Issue 16: what the admin port costs. The SOW apply and gateway publish benchmarks, each
run with the admin port off and on (scraped by a thread as Prometheus would, but every
`--scrape-every` seconds instead of every 15), alternating, best of `--rounds`:

    python -m bench admin [--messages 300000] [--publishes 20000] [--rounds 3]
                          [--scrape-every 1]

The target: the "on" rate within 3% of the "off" rate (ratio >= 0.97). The counters the
worker and gateway keep are plain ints that run either way; their own cost per publish is
measured apart (a loop of exactly what one publish adds), as a fraction of a publish's
time through the gateway.
"""

from __future__ import annotations

import argparse
import multiprocessing
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager
from urllib.request import urlopen

from amps_on_kafka.admin import AdminServer, Sources
from amps_on_kafka.client import Client
from amps_on_kafka.config.model import AdminConfig
from amps_on_kafka.log.kafka import end_offsets
from amps_on_kafka.processor.worker import Worker
from amps_on_kafka.server.gateway import Gateway
from amps_on_kafka.server.stats import Latencies, Traffic
from bench.common import Result, bootstrap, documents, new_topic, report
from bench.sow import apply_seconds, fill, run_until_caught_up, sow_config

TARGET = 0.97


@contextmanager
def admin_port(worker: Worker, gateway: Gateway | None, scrape_every: float) -> Iterator[None]:
    """The admin port, and a scraper reading /metrics and /admin every `scrape_every` s."""
    settings = AdminConfig(Listen="127.0.0.1:0")
    stop = threading.Event()
    with AdminServer(Sources(worker, gateway), settings) as admin:

        def scrape() -> None:
            while not stop.wait(scrape_every):
                for path in ("/metrics", "/admin"):
                    with urlopen(f"http://{admin.address}{path}", timeout=10) as response:
                        response.read()

        scraper = threading.Thread(target=scrape, daemon=True)
        scraper.start()
        try:
            yield
        finally:
            stop.set()
            scraper.join()


def apply_run(servers: str, topic: str, metrics: bool, scrape_every: float) -> float:
    """Seconds for a fresh worker to apply the topic, with or without the admin port."""
    ends = end_offsets(servers, topic)
    with tempfile.TemporaryDirectory() as state:
        group = f"bench-admin-{time.monotonic_ns()}"
        worker = Worker(sow_config(topic, 1), servers, state, group_id=group)
        try:
            if not metrics:
                return apply_seconds(worker, topic, ends)
            with admin_port(worker, None, scrape_every):
                return apply_seconds(worker, topic, ends)
        finally:
            worker.stop()


def publish(address: str, topic: str, count: int) -> float:
    """Seconds for `count` publishes over tcp:// until every one is persisted (in a
    spawned process, as an application publishes)."""
    docs = documents(count, count, seed=3)
    with Client("bench-admin-publisher") as client:
        client.connect(f"tcp://{address}/amps/json")
        client.logon()
        start = time.perf_counter()
        for doc in docs:
            client.publish(topic, doc)
        client.publish_flush(300)
        return time.perf_counter() - start


def publish_run(
    servers: str, pool: ProcessPoolExecutor, count: int, metrics: bool, scrape_every: float
) -> float:
    topic = new_topic(servers, "admin-publish", 1, key=("/id",))
    with tempfile.TemporaryDirectory() as state:
        worker = Worker(sow_config(topic, 1), servers, state, group_id=f"bench-{topic}")
        run_until_caught_up(worker, topic, end_offsets(servers, topic))
        gateway = Gateway(worker.engine, servers, listen="127.0.0.1:0")
        gateway.start()
        try:
            if not metrics:
                return pool.submit(publish, gateway.address, topic, count).result()
            with admin_port(worker, gateway, scrape_every):
                return pool.submit(publish, gateway.address, topic, count).result()
        finally:
            gateway.stop()
            worker.stop()


def best_of(rounds: int, run: Callable[[bool], float]) -> tuple[float, float]:
    """The shortest time off and on, the two alternating so drift hits both alike."""
    off, on = [], []
    for _ in range(rounds):
        off.append(run(False))
        on.append(run(True))
    return min(off), min(on)


def counters_per_publish(loops: int = 200_000) -> float:
    """Seconds of counting per publish: what the hooks add (a start time, a latency
    observed, and the frame and byte counts of the publish and its ack)."""
    latencies, traffic = Latencies(), Traffic()
    start = time.perf_counter()
    for _ in range(loops):
        started = time.perf_counter()
        traffic.bytes_in += 250
        traffic.frames_in += 1
        latencies.observe(time.perf_counter() - started)
        traffic.frames_out += 1
        traffic.bytes_out += 60
    return (time.perf_counter() - start) / loops


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench admin")
    parser.add_argument("--messages", type=int, default=300_000)
    parser.add_argument("--publishes", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--scrape-every", type=float, default=1.0)
    args = parser.parse_args(argv)
    servers = bootstrap()
    every = args.scrape_every
    print(f"# admin port off vs on (scraped every {every:g} s), best of {args.rounds}")

    topic = new_topic(servers, "admin-apply", 1, key=("/id",))
    fill(servers, topic, documents(args.messages, 100_000))
    off, on = best_of(args.rounds, lambda metrics: apply_run(servers, topic, metrics, every))
    report(
        f"SOW apply, {args.messages:,} publishes",
        Result("metrics on", on, args.messages),
        Result("off", off, args.messages),
        TARGET,
    )

    spawn = multiprocessing.get_context("spawn")  # never fork a process holding RocksDB
    with ProcessPoolExecutor(max_workers=1, mp_context=spawn) as pool:
        count = args.publishes
        off, on = best_of(
            args.rounds, lambda metrics: publish_run(servers, pool, count, metrics, every)
        )
    report(
        f"gateway publish, {count:,} persisted",
        Result("metrics on", on, count),
        Result("off", off, count),
        TARGET,
    )
    hooks = counters_per_publish()
    print(
        f"counters per publish: {hooks * 1e9:.0f} ns, {hooks / (off / count):.2%} of a "
        f"publish's {off / count * 1e6:.0f} us through the gateway (they run either way)",
        flush=True,
    )


if __name__ == "__main__":
    main()
