"""An engine over real stores, built the same way by the tests that read through it."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from amps_on_kafka.config import Config
from amps_on_kafka.log.codecs import JSON
from amps_on_kafka.processor.engine import SowEngine
from amps_on_kafka.state.sow import SowRules
from amps_on_kafka.state.store import PartitionStore


@contextmanager
def two_store_engine(
    make_dir: Callable[[str], Path],
    topic: str,
    now: int,
    fill: Callable[[list[PartitionStore]], None] = lambda stores: None,
) -> Iterator[SowEngine]:
    """A JSON SOW topic keyed by /id with expiration, its partitions 0 and 1 in two real
    stores (`fill` writes them before they are attached), read at the fixed clock `now`."""
    config = Config.model_validate(
        {
            "Topics": [{"Name": topic}],
            "SOW": [{"Topic": topic, "Key": "/id", "Expiration": "enabled"}],
        }
    )
    engine = SowEngine(config, {topic: SowRules(config.sow[0], JSON)}, lambda: now)
    stores = [PartitionStore(make_dir(f"p{p}") / "store", topic, p, JSON) for p in (0, 1)]
    fill(stores)
    for store in stores:
        engine.attach(store)
    try:
        yield engine
    finally:
        for store in stores:
            engine.detach(topic, store.partition)
            store.close()
