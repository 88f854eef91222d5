"""Issue 16: what the admin port costs. The SOW apply and gateway publish benchmarks, each
run with the admin port off and on (scraped by a thread as Prometheus would, but every
`--scrape-every` seconds instead of every 15), alternating, best of `--rounds`:

    python -m bench admin [--messages 300000] [--publishes 40000] [--rounds 3]
                          [--scrape-every 1]

Each is reported twice: records per CPU second of this process (the worker, its gateway
and the admin port; the publishing client runs in a process of its own), which is what
the port costs and what the target is about (the "on" rate within 3% of the "off" rate,
ratio >= 0.97); and records per second of wall time, which on a machine shared with other
work moves by more than that from one run to the next. The counters the worker and
gateway keep are plain ints that run either way; their own cost per publish is measured
apart (a loop of exactly what one publish adds), as a fraction of a publish's CPU time.
"""

from __future__ import annotations

import argparse
import multiprocessing
import resource
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
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


@dataclass(frozen=True)
class Run:
    wall: float  # seconds
    cpu: float  # seconds of this process's CPU (user and system)


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def measured(work: Callable[[], float]) -> Run:
    """`work` returns its own wall seconds; the CPU is this process's meanwhile."""
    start = cpu_seconds()
    wall = work()
    return Run(wall, cpu_seconds() - start)


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


def apply_run(servers: str, topic: str, metrics: bool, scrape_every: float) -> Run:
    """A fresh worker applying the topic, with or without the admin port."""
    ends = end_offsets(servers, topic)
    with tempfile.TemporaryDirectory() as state:
        group = f"bench-admin-{time.monotonic_ns()}"
        worker = Worker(sow_config(topic, 1), servers, state, group_id=group)
        work = partial(apply_seconds, worker, topic, ends)
        try:
            if not metrics:
                return measured(work)
            with admin_port(worker, None, scrape_every):
                return measured(work)
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


def _publish_in(pool: ProcessPoolExecutor, address: str, topic: str, count: int) -> float:
    return pool.submit(publish, address, topic, count).result()


def publish_run(
    servers: str, pool: ProcessPoolExecutor, count: int, metrics: bool, scrape_every: float
) -> Run:
    topic = new_topic(servers, "admin-publish", 1, key=("/id",))
    with tempfile.TemporaryDirectory() as state:
        worker = Worker(sow_config(topic, 1), servers, state, group_id=f"bench-{topic}")
        run_until_caught_up(worker, topic, end_offsets(servers, topic))
        gateway = Gateway(worker.engine, servers, listen="127.0.0.1:0")
        gateway.start()
        work = partial(_publish_in, pool, gateway.address, topic, count)
        try:
            if not metrics:
                return measured(work)
            with admin_port(worker, gateway, scrape_every):
                return measured(work)
        finally:
            gateway.stop()
            worker.stop()


def best_of(rounds: int, run: Callable[[bool], Run]) -> tuple[Run, Run]:
    """The least wall and CPU time off and on, alternating (off first in even rounds, on
    first in odd ones) so that drift and warm caches favour neither."""
    runs: dict[bool, list[Run]] = {False: [], True: []}
    for round_ in range(rounds):
        for metrics in (False, True) if round_ % 2 == 0 else (True, False):
            runs[metrics].append(run(metrics))
    return _best(runs[False]), _best(runs[True])


def _best(runs: list[Run]) -> Run:
    return Run(min(r.wall for r in runs), min(r.cpu for r in runs))


def report_pair(title: str, off: Run, on: Run, count: int) -> None:
    cpu_on, cpu_off = Result("metrics on", on.cpu, count), Result("off", off.cpu, count)
    report(f"{title}, CPU", cpu_on, cpu_off, TARGET)
    report(f"{title}, wall", Result("metrics on", on.wall, count), Result("off", off.wall, count))


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


def scrape_cpu(servers: str, topic: str, scrapes: int = 50) -> float:
    """CPU seconds of one scrape of /metrics and /admin (server and client both in this
    process, so an upper bound), against a worker holding the topic and its gateway."""
    with tempfile.TemporaryDirectory() as state:
        worker = Worker(sow_config(topic, 1), servers, state, group_id=f"bench-{topic}-scrape")
        run_until_caught_up(worker, topic, end_offsets(servers, topic))
        gateway = Gateway(worker.engine, servers, listen="127.0.0.1:0")
        gateway.start()
        settings = AdminConfig(Listen="127.0.0.1:0")
        try:
            with AdminServer(Sources(worker, gateway), settings) as admin:
                start = cpu_seconds()
                for _ in range(scrapes):
                    for path in ("/metrics", "/admin"):
                        with urlopen(f"http://{admin.address}{path}", timeout=10) as response:
                            response.read()
                return (cpu_seconds() - start) / scrapes
        finally:
            gateway.stop()
            worker.stop()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench admin")
    parser.add_argument("--messages", type=int, default=300_000)
    parser.add_argument("--publishes", type=int, default=40_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--scrape-every", type=float, default=1.0)
    args = parser.parse_args(argv)
    servers = bootstrap()
    every = args.scrape_every
    print(f"# admin port off vs on (scraped every {every:g} s), best of {args.rounds}")

    topic = new_topic(servers, "admin-apply", 1, key=("/id",))
    fill(servers, topic, documents(args.messages, 100_000))
    off, on = best_of(args.rounds, lambda metrics: apply_run(servers, topic, metrics, every))
    report_pair(f"SOW apply, {args.messages:,} publishes", off, on, args.messages)

    spawn = multiprocessing.get_context("spawn")  # never fork a process holding RocksDB
    with ProcessPoolExecutor(max_workers=1, mp_context=spawn) as pool:
        count = args.publishes
        off, on = best_of(
            args.rounds, lambda metrics: publish_run(servers, pool, count, metrics, every)
        )
    report_pair(f"gateway publish, {count:,} persisted", off, on, count)
    hooks, per_publish = counters_per_publish(), off.cpu / count
    print(
        f"counters per publish: {hooks * 1e9:.0f} ns, {hooks / per_publish:.2%} of the "
        f"{per_publish * 1e6:.0f} us of CPU a publish takes (they run either way)",
        flush=True,
    )
    scrape = scrape_cpu(servers, topic)
    print(
        f"one scrape of /metrics and /admin: {scrape * 1e3:.1f} ms of CPU; scraped every "
        f"{every:g} s that is {scrape / every:.2%} of a core, every 15 s {scrape / 15:.3%}",
        flush=True,
    )


if __name__ == "__main__":
    main()
