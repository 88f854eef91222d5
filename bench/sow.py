"""Issue 4 benchmarks: SOW apply, expiration lag and restart-to-serving, beside raw consume.

    python -m bench sow [--messages 1000000] [--keys 100000] [--expiring 100000] [--rounds 3]
                        [--no-quix]

The Quix Streams peer runs in its own virtualenv (.venv-bench-quix, made on first use),
because quixstreams pins an older confluent-kafka than this project uses.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import queue
import random
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from amps_on_kafka.client import Client
from amps_on_kafka.config import Config
from amps_on_kafka.log.kafka import end_offsets
from amps_on_kafka.log.publisher import LogPublisher
from amps_on_kafka.processor.worker import Worker
from amps_on_kafka.server.gateway import Gateway
from bench.common import Result, bootstrap, documents, new_topic, report
from bench.log import raw_consume

ROOT = Path(__file__).parents[1]
QUIX_VENV = ROOT / ".venv-bench-quix"


def fill(servers: str, topic: str, docs: list[dict], expiration: float | None = None) -> None:
    publisher = LogPublisher(servers, "bench-sow", report_successes=False)
    for doc in docs:
        publisher.publish(topic, doc, expiration=expiration)
    publisher.flush(300)


def sow_config(topic: str, partitions: int, expiration: str = "disabled") -> Config:
    return Config.model_validate(
        {
            "Topics": [{"Name": topic, "Partitions": partitions}],
            "SOW": [{"Topic": topic, "Key": "/id", "Expiration": expiration}],
        }
    )


def run_until_caught_up(worker: Worker, topic: str, ends: dict[int, int]) -> float:
    """Seconds from start to every partition's stored offset at the log end."""
    start = time.perf_counter()
    worker.start()
    worker.wait_ready(120)
    worker.wait_caught_up(topic, ends, timeout=1800)
    return time.perf_counter() - start


def apply_seconds(worker: Worker, topic: str, ends: dict[int, int]) -> float:
    """Seconds from the first batch applied to the last, timed like raw consume and the
    Quix peer (from their first record): joining the group is not applying."""
    first: list[float] = []
    worker.engine.add_listener(lambda _: first or first.append(time.perf_counter()))
    worker.start()
    worker.wait_ready(120)
    worker.wait_caught_up(topic, ends, timeout=1800)
    return time.perf_counter() - first[0]


def quix_rate(servers: str, topic: str, count: int) -> Result | None:
    if not (QUIX_VENV / "bin" / "python").exists():
        print("# making .venv-bench-quix for the Quix Streams peer ...", flush=True)
        subprocess.run([sys.executable, "-m", "venv", str(QUIX_VENV)], check=True)
        subprocess.run(
            [str(QUIX_VENV / "bin" / "pip"), "install", "-q", "quixstreams>=3.20,<4"], check=True
        )
    with tempfile.TemporaryDirectory() as state:
        done = subprocess.run(
            [
                str(QUIX_VENV / "bin" / "python"),
                str(ROOT / "bench" / "quix_peer.py"),
                servers,
                topic,
                str(count),
                state,
            ],
            capture_output=True,
            text=True,
            check=False,
            timeout=1800,
        )
    if done.returncode != 0:
        print(f"# Quix peer failed: {done.stderr.strip()[-500:]}")
        return None
    outcome = json.loads(done.stdout.strip().splitlines()[-1])
    return Result("quix", outcome["seconds"], outcome["count"])


def worker_apply(servers: str, topic: str, messages: int, group: str) -> tuple[Result, int]:
    """A new worker, with an empty state directory, applying the whole topic (one
    partition): its rate, and how many records its SOW holds after."""
    with tempfile.TemporaryDirectory() as state:
        worker = Worker(sow_config(topic, 1), servers, state, group_id=group)
        seconds = apply_seconds(worker, topic, end_offsets(servers, topic))
        count = sum(s.count() for s in worker.engine.stores())
        worker.stop()
    return Result("worker", seconds, messages), count


def bench_apply(servers: str, messages: int, keys: int, quix: bool, rounds: int) -> None:
    """Raw consume and the worker alternate for `rounds` rounds over the same topic, and
    each side's best is compared: on a shared machine one run moves by 30% or more."""
    partitions = 1
    topic = new_topic(servers, "sow", partitions, key=("/id",))
    fill(servers, topic, documents(messages, keys))
    peers, ours = [], []
    for index in range(rounds):
        peers.append(raw_consume(servers, topic, partitions, messages))
        result, count = worker_apply(servers, topic, messages, f"bench-{topic}-{index}")
        ours.append(result)
    peer, best = max(peers, key=lambda r: r.rate), max(ours, key=lambda r: r.rate)
    title = f"SOW apply: {messages:,} publishes over {keys:,} keys (best of {rounds})"
    report(title, best, peer, 0.5)
    print(f"{'':<48} worker {best.rate:,.0f} upserts/s (target 100,000); SOW holds {count:,}")
    ratios = ", ".join(f"{o.rate / p.rate:.2f}" for o, p in zip(ours, peers, strict=True))
    print(f"{'':<48} each round's ratio: {ratios}", flush=True)
    throttled = raw_consume(servers, topic, partitions, messages, defaults=True)
    report("  the same, beside raw with librdkafka's defaults", best, throttled)
    if quix:
        quix_result = quix_rate(servers, topic, messages)
        if quix_result is not None:
            report("SOW apply vs the Quix Streams peer", best, quix_result)


def bench_restart(servers: str, messages: int, keys: int) -> None:
    partitions = 1
    topic = new_topic(servers, "restart", partitions, key=("/id",))
    fill(servers, topic, documents(messages, keys))
    ends = end_offsets(servers, topic)
    with tempfile.TemporaryDirectory() as state:
        config = sow_config(topic, partitions)
        first = Worker(config, servers, state, group_id=f"bench-{topic}-a")
        rebuild = run_until_caught_up(first, topic, ends)
        first.stop()
        second = Worker(config, servers, state, group_id=f"bench-{topic}-b")
        resume = run_until_caught_up(second, topic, ends)
        second.stop()
    print(
        f"restart-to-serving, SOW of {keys:,} records: {resume:.2f}s "
        f"(a rebuild from the log took {rebuild:.2f}s; ratio {rebuild / resume:.1f}x)",
        flush=True,
    )


EXPIRATION = 3  # seconds each record of an expiration burst lives
LAG_TARGET = 100  # ms: issue 4's p99 of the expiration lag


def bench_expiration(servers: str, count: int) -> None:
    """Issue 4's expiration lag, over bursts of `count` records that each expire
    EXPIRATION seconds after its publish (published at full rate by another process, so
    the deadlines come at the publishing rate): first the worker's sweep alone (from a
    deadline to the record's removal written and announced to the worker's listeners),
    then, in a second burst with a gateway, what a user sees: the oof `expired` a
    subscriber gets (another process, over tcp://, subscribed to 1 record in 10), and
    look-ups by key meanwhile, which must never return a record past its deadline
    (queries hide one at read time, before any sweep: docs/performance.md, "Expiration
    lag")."""
    swept, late, _ = expiry_burst(servers, count, watch=False)
    print_lags("expiration lag, the sweep (deadline to removal written)", swept, LAG_TARGET)
    print_late(late)
    swept, late, seen = expiry_burst(servers, count, watch=True)
    print_lags("  the same, with the gateway and a subscriber", swept)
    print_late(late)
    if seen is None:
        print("  the subscriber process did not report")
        return
    oofs, looked, found, past = seen
    print_lags("  oof expired delivered to the subscriber", oofs, LAG_TARGET)
    print(
        f"  look-ups by key during the burst: {looked:,}, {found:,} found a record, "
        f"{past} of them past its deadline (queries hide it at its deadline: must be 0)",
        flush=True,
    )


def print_late(late: int) -> None:
    if late:
        print(
            f"    ({late:,} records were applied at or after their deadline: the worker's "
            f"apply was over {EXPIRATION} s behind the publisher, and their lag is the apply's)"
        )


def print_lags(title: str, lags: list[float], target: float | None = None) -> None:
    """p50 and p99 of lags in ms (and the target's verdict)."""
    if not lags:
        print(f"{title}: none")
        return
    lags = sorted(lags)
    p50, p99 = lags[len(lags) // 2], lags[max(0, int(len(lags) * 0.99) - 1)]
    verdict = "" if target is None else f" (target p99 <= {target:.0f} ms)"
    print(f"{title} over {len(lags):,} records: p50 {p50:.0f} ms, p99 {p99:.0f} ms{verdict}")


Watched = tuple[list[float], int, int, int]  # oof lags (ms), look-ups, found, past deadline
Burst = tuple[list[float], int, Watched | None]  # sweep lags (ms), applied late, watched


def expiry_burst(servers: str, count: int, watch: bool) -> Burst:
    """One burst: the sweep's lag of each record (ms from its deadline to its 'expire'
    change reaching the worker's listeners), how many records were applied only at or
    after their deadline (the worker's apply was EXPIRATION s behind the publisher: the
    lag of those is the apply's, not the sweep's) and, with `watch`, what the
    subscriber process saw (watch_expiry)."""
    topic = new_topic(servers, "expire", 1, key=("/id",))
    lags: list[float] = []
    late = [0]
    done = threading.Event()

    def on_batch(applied) -> None:
        now = time.time() * 1000
        changes = applied.changes
        lags.extend(now - c.old.deadline for c in changes if c.kind == "expire")
        late[0] += sum(1 for c in changes if c.kind == "upsert" and c.new.deadline <= now)
        if len(lags) >= count:
            done.set()

    with tempfile.TemporaryDirectory() as state:
        worker = Worker(sow_config(topic, 1, "enabled"), servers, state, group_id=f"b-{topic}")
        worker.engine.add_listener(on_batch)
        worker.start()
        worker.wait_ready(120)
        gateway = Gateway(worker.engine, servers, listen="127.0.0.1:0") if watch else None
        watcher = None if gateway is None else Watcher(gateway.start(), topic, count)
        publish_burst(servers, topic, count)
        done.wait(120)
        seen = None if watcher is None else watcher.result()
        if gateway is not None:
            gateway.stop()
        worker.stop()
    return lags, late[0], seen


def publish_burst(servers: str, topic: str, count: int) -> None:
    """`count` records expiring EXPIRATION s after each publish, published from a process
    of its own, as an application would: from this one its publisher would hold the
    worker's GIL (a slower fill overlapping the first deadlines made the tail)."""
    context = multiprocessing.get_context("spawn")
    process = context.Process(target=fill_expiring, args=(servers, topic, count))
    process.start()
    process.join(300)


def fill_expiring(servers: str, topic: str, count: int) -> None:
    fill(servers, topic, documents(count, count), expiration=EXPIRATION)


class Watcher:
    """watch_expiry in a spawned process, subscribed before the burst is published."""

    def __init__(self, address: str, topic: str, count: int) -> None:
        context = multiprocessing.get_context("spawn")
        self._ready = context.Event()
        self._results = context.Queue()
        self._process = context.Process(
            target=watch_expiry, args=(address, topic, count, self._ready, self._results)
        )
        self._process.start()
        if not self._ready.wait(60):
            raise RuntimeError("the subscriber process did not subscribe within 60 s")

    def result(self) -> Watched | None:
        try:
            return self._results.get(timeout=120)
        except queue.Empty:
            return None
        finally:
            self._process.join(10)


WATCHED = 10  # the subscriber follows 1 record in WATCHED


def watch_expiry(address: str, topic: str, count: int, ready, results) -> None:
    """A client, as an application: subscribed with oof to 1 record in WATCHED, it notes
    how long after its deadline (the record's timestamp plus expiration) each oof
    `expired` arrives, and meanwhile looks up random keys, counting the records returned
    after their deadline had passed when the look-up was sent."""
    oofs: list[float] = []
    got = threading.Event()
    wanted = len(range(0, count, WATCHED))

    def on_message(message) -> None:
        if message.command == "oof" and message.reason == "expired":
            oofs.append(time.time() * 1000 - _deadline(message))
            if len(oofs) >= wanted:
                got.set()

    rng = random.Random(5)
    looked = found = past = 0
    until = time.monotonic() + 120
    with Client("bench-expiry") as client:
        client.connect(f"tcp://{address}/amps/json")
        client.logon()
        client.subscribe(topic, f"/id % {WATCHED} = 0", "oof", on_message=on_message)
        ready.set()
        while not got.wait(0.002) and time.monotonic() < until:
            sent = time.time() * 1000
            records = list(client.sow(topic, f"/id = {rng.randrange(count)}"))
            looked, found = looked + 1, found + len(records)
            past += sum(1 for r in records if _deadline(r) <= sent)
    results.put((oofs, looked, found, past))


def _deadline(message) -> float:
    """A record's deadline (ms), from what the gateway sends with it."""
    return message.timestamp + round(message.expiration * 1000)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench sow")
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--keys", type=int, default=100_000)
    parser.add_argument("--expiring", type=int, default=100_000)
    parser.add_argument("--restart-records", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=3, help="of raw consume and apply")
    parser.add_argument("--no-quix", action="store_true")
    args = parser.parse_args(argv)
    servers = bootstrap()
    bench_apply(servers, args.messages, args.keys, not args.no_quix, args.rounds)
    bench_expiration(servers, args.expiring)
    bench_restart(servers, args.restart_records, args.restart_records)


if __name__ == "__main__":
    main()
