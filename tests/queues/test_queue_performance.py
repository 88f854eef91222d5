"""Performance regression check for queue delivery through the gateway (docs/performance.md).

Four subscriber processes take an at-least-once queue's messages (max_backlog 10, acks
batched by 5, batched delivery) beside four KIP-932 share consumers (`max.poll.records`
10) acknowledging each record, in the same run, as `python -m bench queues --backlog 10
--ack-batch 5` does (the bench's default is now 1000 and 500: `max.poll.records` is soft,
the share consumers take thousands a poll; this check keeps the older, harder setting,
which its floor was measured at).
The best of the rounds over the median share-group round is compared with a floor: a
one-off stall costs one round, and the share groups' own rate swings 2-3x between runs on
this machine. Issue 18's target is 0.5x; the design reaches 0.07-0.2x today (the doc says
why), so the floor is half of the low end of that, and only a real regression fails it.
"""

from __future__ import annotations

import argparse
import statistics

import pytest

from bench.queues import ours, produce, share_run

SAMPLE = 10_000  # messages: enough that the per-message cost dominates
ROUNDS = 2
FLOOR = 0.035  # of Kafka's share groups (issue 18's target: 0.5x)


@pytest.mark.timing
def test_queue_delivery_keeps_a_share_of_kafkas_share_groups(bootstrap, topic_factory) -> None:
    settings = argparse.Namespace(subscribers=4, backlog=10, ack_batch=5, unbatched=False)
    shared = topic_factory(1)
    produce(bootstrap, shared, SAMPLE)
    mine, peers = [], []
    for _ in range(ROUNDS):
        mine.append(ours(bootstrap, topic_factory(1), SAMPLE, settings).rate)
        peers.append(share_run(bootstrap, shared, SAMPLE, settings).rate)
    ratio = max(mine) / statistics.median(peers)
    assert ratio >= FLOOR, f"best queue / median share group {ratio:.3f}: {mine=} {peers=}"
