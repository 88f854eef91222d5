"""Shared pieces of the benchmarks: the broker, payloads, timing and the ratio table.

Machines here are noisy, so every benchmark measures the project beside raw
confluent-kafka in the same run, on the same broker and data, and reports the ratio.
"""

from __future__ import annotations

import random
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass

import orjson
from confluent_kafka.admin import AdminClient

from amps_on_kafka.broker import resolve_bootstrap
from amps_on_kafka.log.registry import TopicRegistry, TopicSpec
from amps_on_kafka.log.topics import create_log_topics

SYMBOLS = ["IBM", "MSFT", "AAPL", "ORCL", "GOOG", "AMZN", "META", "NVDA"]


def bootstrap() -> str:
    return resolve_bootstrap(None, echo=print)


def new_topic(servers: str, label: str, partitions: int, key: tuple[str, ...] | None = None) -> str:
    name = f"bench.{label}.{uuid.uuid4().hex[:8]}"
    spec = TopicSpec(name, partitions, key=key)
    create_log_topics(
        AdminClient({"bootstrap.servers": servers}), TopicRegistry(servers), [(spec, 1, None)]
    )
    return name


def documents(count: int, keys: int = 100_000, seed: int = 7) -> list[dict]:
    """Orders whose JSON encoding is about 200 bytes."""
    rng = random.Random(seed)
    pad = "x" * 135
    return [
        {
            "id": i % keys,
            "sym": rng.choice(SYMBOLS),
            "qty": rng.randint(1, 1000),
            "px": round(rng.uniform(10, 500), 2),
            "side": rng.choice(("buy", "sell")),
            "note": pad,
        }
        for i in range(count)
    ]


def encoded_size(doc: dict) -> int:
    return len(orjson.dumps(doc))


@dataclass
class Result:
    name: str
    seconds: float
    count: int

    @property
    def rate(self) -> float:
        return self.count / self.seconds if self.seconds else float("inf")


def timed(name: str, count: int, run: Callable[[], object]) -> Result:
    start = time.perf_counter()
    run()
    return Result(name, time.perf_counter() - start, count)


def report(title: str, ours: Result, peer: Result, target: float | None = None) -> None:
    ratio = ours.rate / peer.rate
    verdict = (
        ""
        if target is None
        else ("  (target {:.2f}x: {})".format(target, "met" if ratio >= target else "MISSED"))
    )
    print(
        f"{title:<48} ours {ours.rate:>11,.0f}/s  {peer.name} {peer.rate:>11,.0f}/s  "
        f"ratio {ratio:.2f}x{verdict}",
        flush=True,
    )
