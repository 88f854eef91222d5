"""Issue 6 benchmark: replay through a bookmark store, beside replay with no store.

python -m bench stores [--messages 200000] [--partitions 1]

Both replays read the same topic in the same run, decode every payload, and are timed
from the first message to the completed marker. The store run logs every message and
discards it as soon as it is read, in the order it came (the usual subscriber), so it
pays for a record per message in the store's file. The two alternate for --rounds rounds
and each side's best is compared: on a shared machine one run moves by 10% or more.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

from confluent_kafka.admin import AdminClient

from amps_on_kafka.client import Client
from amps_on_kafka.client.bookmark_store import BookmarkStore, MemoryBookmarkStore
from amps_on_kafka.client.logged_bookmark_store import LoggedBookmarkStore
from amps_on_kafka.client.ring_bookmark_store import RingBookmarkStore
from amps_on_kafka.log.message import COMPLETED
from bench.common import Result, bootstrap, documents, encoded_size, new_topic, report


def fill(servers: str, topic: str, count: int) -> None:
    with Client("bench-store-publisher") as client:
        client.connect(f"kafka://{servers}")
        for doc in documents(count):
            client.publish(topic, doc)
        client.publish_flush(120)


def replay(servers: str, topic: str, count: int, name: str, store: BookmarkStore | None) -> Result:
    with Client(f"bench-store-{name}") as client:
        client.connect(f"kafka://{servers}")
        client.set_bookmark_store(store)
        seen, started = 0, None
        with client.bookmark_subscribe(topic, "0", sub_id=f"bench-{name}") as stream:
            for message in stream:
                started = started or time.perf_counter()
                if message is COMPLETED:
                    break
                message.data  # noqa: B018 - decode, as a subscriber would
                if store is not None:
                    message.discard()
                seen += 1
        elapsed = time.perf_counter() - (started or time.perf_counter())
    assert seen == count, (seen, count)
    return Result(name, elapsed, count)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench stores")
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--partitions", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--profile", action="store_true", help="cProfile the logged run")
    args = parser.parse_args(argv)
    servers = bootstrap()
    topic = new_topic(servers, "stores", args.partitions, key=("/id",))
    try:
        compare(servers, topic, args.messages, args.rounds, args.profile)
    finally:
        AdminClient({"bootstrap.servers": servers}).delete_topics([topic])


def compare(servers: str, topic: str, count: int, rounds: int, profile: bool) -> None:
    print(f"# {count:,} messages of ~{encoded_size(documents(1)[0])} bytes, broker {servers}")
    fill(servers, topic, count)
    replay(servers, topic, count, "warm-up", None)  # page cache and connections warm
    with tempfile.TemporaryDirectory() as folder:
        stores: dict[str, Callable[[], BookmarkStore]] = {
            "logged": lambda: LoggedBookmarkStore(Path(folder, "logged.bm")),
            "ring": lambda: RingBookmarkStore(Path(folder, "ring.bm")),
            "memory": MemoryBookmarkStore,
        }
        for name, make in stores.items():
            peers, ours = [], []
            for _ in range(rounds):
                peers.append(replay(servers, topic, count, "no-store", None))
                with make() as store:
                    run = partial(replay, servers, topic, count, name, store)
                    ours.append(_profiled(run) if profile and name == "logged" else run())
                    store.purge()  # the next round replays the topic afresh
            best = partial(max, key=lambda result: result.rate)
            target = 0.7 if name == "logged" else None
            report(f"replay + {name} store, discard each", best(ours), best(peers), target)


def _profiled(run: Callable[[], Result]) -> Result:
    import cProfile
    import pstats

    profiler = cProfile.Profile()
    result = profiler.runcall(run)
    pstats.Stats(profiler).sort_stats("tottime").print_stats(15)
    return result


if __name__ == "__main__":
    main()
