"""Gateway.MaxBufferedBytes: the bytes queued unsent for all connections together are
bounded (server/buffers.py), not only each connection's (MaxQueuedBytes).

Three subscribers read nothing while 40 MB of changes are fanned out: the kernel's socket
buffers take a few MB of each connection's (a receive buffer that is not read does not
grow), the gateway queues the rest.
"""

from __future__ import annotations

import contextlib
import threading

import pytest
from pydantic import ValidationError

from amps_on_kafka.config.model import GatewayConfig
from amps_on_kafka.server import fanout
from tests.server.conftest import TOPIC, fanned_out
from tests.server.helpers import Wire, is_ack

MIB = 1024 * 1024
# Without the budget the subscriber of everything would hold up to 40 MB: under its own
# MaxQueuedBytes (64 MiB), so only the budget can cut it. The two that read 1/8 each
# hold at most 5 MB each, under the budget together: they must not be cut.
BUDGET = GatewayConfig(max_buffered_bytes=12 * MIB)
GROUPS = 8
BATCHES, PER_BATCH, PAD = 400, 10, "x" * 10_000  # 4,000 records, 40 MB


def subscribed(wire: Wire, name: str, group: int | None = None) -> Wire:
    wire.logon(name)
    header = {"c": "subscribe", "cid": "s", "t": TOPIC, "a": "processed"}
    if group is not None:
        header["f"] = f"/g = {group}"
    assert is_ack(wire.request(header), "processed")
    return wire


def publish_all(source) -> None:
    for batch in range(BATCHES):
        keys = [f"{batch}-{i}" for i in range(PER_BATCH)]
        source.upsert(
            **{
                key: {"id": key, "g": (batch * PER_BATCH + i) % GROUPS, "pad": PAD}
                for i, key in enumerate(keys)
            }
        )


def keys_of(group: int) -> list[str]:
    every = [f"{b}-{i}" for b in range(BATCHES) for i in range(PER_BATCH)]
    return [key for n, key in enumerate(every) if n % GROUPS == group]


@pytest.mark.parametrize("direct", [BUDGET], indirect=True)
def test_past_the_budget_the_largest_holder_is_cut_and_the_others_are_served(
    direct, wire_to, caplog
):
    source, gateway = direct
    big = subscribed(wire_to(gateway.address), "big")
    small = [subscribed(wire_to(gateway.address), f"small{g}", g) for g in (1, 2)]
    bystander = subscribed(wire_to(gateway.address), "bystander", 3)
    wanted = len(keys_of(3))
    got: list[str] = []
    reader = threading.Thread(
        target=lambda: got.extend(bystander.recv().header["k"] for _ in range(wanted))
    )
    reader.start()
    publish_all(source)
    fanned_out(gateway)
    reader.join(30)
    assert got == keys_of(3)  # served throughout, while the others held their bytes
    assert gateway.buffers.total <= BUDGET.max_buffered_bytes  # an upper bound of the real sum
    assert big.is_closed()
    [cut] = [r for r in caplog.records if getattr(r, "event", None) == "slow_consumer"]
    assert cut.client == "big" and "MaxBufferedBytes (12,582,912)" in cut.reason
    assert gateway.stats.slow_consumers == 1  # amps_gateway_slow_consumers_total
    for group, wire in zip((1, 2), small, strict=True):  # not cut: everything, in order
        assert [wire.recv().header["k"] for _ in range(wanted)] == keys_of(group)
    assert is_ack(bystander.request({"c": "heartbeat", "cid": "hb"}), "heartbeat")


@pytest.mark.parametrize("direct", [GatewayConfig(max_queued_bytes=64 * 1024)], indirect=True)
def test_a_slow_consumer_with_little_queued_is_told_why_before_the_close(direct, wire_to):
    """The limit is checked before a write: with 10 KB deliveries the buffer holds at most
    64 KiB when the one that would pass it comes, so the failure ack can follow it."""
    source, gateway = direct
    slow = subscribed(wire_to(gateway.address), "slow")
    for n in range(1_000):  # 10 MB, one record per batch: far past the socket buffers
        source.upsert(**{str(n): {"id": str(n), "g": 0, "pad": PAD}})
    fanned_out(gateway)
    frames = []
    with contextlib.suppress(ConnectionError):
        while True:
            frames.append(slow.recv())
    assert frames[-1].header["status"] == "failure"
    assert (
        frames[-1].header["reason"]
        == "slow consumer: more than MaxQueuedBytes (65,536) queued unsent"
    )
    assert [f.header["k"] for f in frames[:-1]] == [str(n) for n in range(len(frames) - 1)]
    assert len(frames) - 1 < 1_000  # cut before the end, nothing missing before the ack


def test_a_batch_larger_than_a_job_goes_in_pieces_in_order(direct, wire_to, monkeypatch):
    """A fan-out job takes at most JOB_BYTES of records (each subscription's frames of a
    job are held at once): a larger batch is cut in pieces, delivered whole and in order."""
    monkeypatch.setattr(fanout, "JOB_BYTES", 25_000)  # about 2 of these records
    source, gateway = direct
    reader = subscribed(wire_to(gateway.address), "reader")
    jobs = []  # the bytes of records each job took
    real = gateway.fanout._blocking
    gateway.fanout._blocking = lambda work, items, sinks: (
        jobs.append(sum(piece.held for piece in items)) or real(work, items, sinks)
    )
    keys = [str(n) for n in range(9)]
    source.upsert(**{key: {"id": key, "g": 0, "pad": PAD} for key in keys})
    assert [reader.recv().header["k"] for _ in keys] == keys
    fanned_out(gateway)
    assert len(jobs) >= 4 and max(jobs) <= 25_000  # 9 records of 10 KB, 2 a job


def test_a_large_fan_out_hands_the_memory_it_freed_back_once_done(direct, wire_to, monkeypatch):
    """The worker trims when its loop goes idle, before the gateway has written what it
    applied; the fan-out trims once its backlog empties after making TRIM_AFTER_BYTES of frames."""
    trimmed = threading.Event()
    monkeypatch.setattr(fanout, "TRIM_AFTER_BYTES", 50_000)
    monkeypatch.setattr(fanout, "release_freed_memory", trimmed.set)
    source, gateway = direct
    reader = subscribed(wire_to(gateway.address), "reader")
    source.upsert(a={"id": "a", "g": 0, "pad": PAD})  # 10 KB: under the threshold
    assert reader.recv().header["k"] == "a"
    fanned_out(gateway)
    assert not trimmed.is_set()
    source.upsert(**{str(n): {"id": str(n), "g": 0, "pad": PAD} for n in range(6)})  # 60 KB
    assert trimmed.wait(15)


def test_max_buffered_bytes_is_checked_at_load():
    with pytest.raises(ValidationError, match="MaxBufferedBytes"):
        GatewayConfig.model_validate({"MaxBufferedBytes": 1000})
    assert GatewayConfig().max_buffered_bytes == 256 * MIB
