"""Issue 4 benchmarks: SOW apply, expiration lag and restart-to-serving, beside raw consume.

    python -m bench sow [--messages 1000000] [--keys 100000] [--expiring 100000] [--rounds 3]
                        [--no-quix]

The Quix Streams peer runs in its own virtualenv (.venv-bench-quix, made on first use),
because quixstreams pins an older confluent-kafka than this project uses.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from amps_on_kafka.config import Config
from amps_on_kafka.log.kafka import end_offsets
from amps_on_kafka.log.publisher import LogPublisher
from amps_on_kafka.processor.worker import Worker
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


def bench_expiration(servers: str, count: int) -> None:
    """p50/p99 of (time the worker removed a record - its deadline), for `count` records."""
    partitions = 1
    topic = new_topic(servers, "expire", partitions, key=("/id",))
    lags: list[float] = []
    done = threading.Event()

    def on_batch(applied) -> None:
        now = time.time() * 1000
        lags.extend(now - c.old.deadline for c in applied.changes if c.kind == "expire")
        if len(lags) >= count:
            done.set()

    with tempfile.TemporaryDirectory() as state:
        worker = Worker(
            sow_config(topic, partitions, "enabled"), servers, state, group_id=f"b-{topic}"
        )
        worker.engine.add_listener(on_batch)
        worker.start()
        worker.wait_ready(120)
        fill(servers, topic, documents(count, count), expiration=3)
        done.wait(120)
        worker.stop()
    lags.sort()
    if not lags:
        print("expiration lag: no record expired")
        return
    p50, p99 = lags[len(lags) // 2], lags[int(len(lags) * 0.99) - 1]
    print(
        f"expiration lag over {len(lags):,} records: p50 {p50:.0f} ms, p99 {p99:.0f} ms "
        "(target p99 <= 100 ms)"
    )


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
