"""A gateway whose peer freezes (issue 15: "a query never returns a partial answer, it
waits or fails with retry:"): a SIGSTOPped worker keeps its connections open but never
answers, so a query forwarded to it must not wait on it once the group has given its
partitions to another worker.

Two `amps-kafka worker` processes with standby copies share a two-partition SOW topic.
One of them is frozen; a sow through the other is answered in full (or refused with
retry:) once the group has moved the frozen worker's partitions, well before the 30 s a
peer may stay silent (peers.ANSWER_IDLE). About 10 s.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

from amps_on_kafka.client import Client
from amps_on_kafka.errors import AmpsError
from tests.polling import until
from tests.scaling.helpers import DEADLINE, partition_owners, publish_all, session_timeout
from tests.scaling.workers import WorkerProcess, start_all, write_config

KEYS = 20
PARTITIONS = 2


def sow_keys(address: str, topic: str) -> list[int]:
    with Client(f"q-{uuid.uuid4().hex[:8]}") as client:
        client.connect(address)
        client.logon(10)
        return sorted(m.data["id"] for m in client.sow(topic, timeout=20))


@pytest.mark.timeout(120)
def test_a_query_does_not_wait_on_a_frozen_peer_whose_partitions_moved(
    bootstrap: str, topic_factory: Callable[..., str], tmp_path: Path
) -> None:
    topic = topic_factory(PARTITIONS, key=("/id",))
    timeout = session_timeout(bootstrap)
    config = write_config(tmp_path / "w.yaml", topic, PARTITIONS, timeout, standby=True)
    group = f"frozen-{uuid.uuid4().hex[:8]}"
    workers = [WorkerProcess(f"w{i}", config, bootstrap, group, tmp_path) for i in range(2)]
    try:
        start_all(workers)
        publish_all(f"kafka://{bootstrap}", topic, ({"id": key} for key in range(KEYS)))
        owners = partition_owners(bootstrap, group, topic, PARTITIONS)
        assert sorted(owners.values()) == ["w0", "w1"]  # the query needs the frozen one
        frozen, asked = workers
        address = asked.wait_ready()
        until(  # both workers apply what was published
            lambda: sow_keys(address, topic) == list(range(KEYS)),
            "every published key applied",
            DEADLINE,
        )

        frozen.freeze()
        try:  # a gateway that waits out the frozen peer (30 s) makes the client give up
            assert sow_keys(address, topic) == list(range(KEYS))
        except AmpsError as exc:
            assert exc.reason.startswith("retry:"), exc.reason
    finally:
        for worker in workers:
            if worker.process is not None and worker.process.poll() is None:
                worker.thaw()
            worker.stop()
