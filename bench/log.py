"""Issue 2 benchmarks: Client.publish and bookmark_subscribe beside raw confluent-kafka.

python -m bench log [--messages 500000]
"""

from __future__ import annotations

import argparse

import orjson
from confluent_kafka import TopicPartition

from amps_on_kafka.client import Client
from amps_on_kafka.log.kafka import log_producer, reader
from amps_on_kafka.log.message import COMPLETED
from bench.common import bootstrap, documents, encoded_size, new_topic, report, timed


def raw_produce(servers: str, topic: str, docs: list[dict]) -> None:
    producer = log_producer(servers)
    produce, poll = producer.produce, producer.poll
    for i, doc in enumerate(docs):
        while True:
            try:
                produce(topic, orjson.dumps(doc))
                break
            except BufferError:
                poll(0.05)
        if i % 1000 == 0:
            poll(0)
    assert producer.flush(120) == 0


def client_publish(servers: str, topic: str, docs: list[dict]) -> None:
    with Client("bench-publisher") as client:
        client.connect(f"kafka://{servers}")
        publish = client.publish
        for doc in docs:
            publish(topic, doc)
        client.publish_flush(120)


def raw_consume(servers: str, topic: str, partitions: int, count: int) -> None:
    consumer = reader(servers)
    consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    seen = 0
    while seen < count:
        for record in consumer.consume(2000, timeout=1.0):
            orjson.loads(record.value())
            seen += 1
    consumer.close()


def client_replay(servers: str, topic: str, count: int) -> None:
    with Client("bench-subscriber") as client:
        client.connect(f"kafka://{servers}")
        seen = 0
        with client.bookmark_subscribe(topic, "0") as stream:
            for message in stream:
                if message is COMPLETED:
                    break
                message.data  # noqa: B018 - decode, as a subscriber would
                seen += 1
    assert seen == count, (seen, count)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench log")
    parser.add_argument("--messages", type=int, default=500_000)
    args = parser.parse_args(argv)
    servers = bootstrap()
    docs = documents(args.messages)
    print(
        f"# {args.messages:,} messages of ~{encoded_size(docs[0])} bytes of JSON, broker {servers}"
    )
    for partitions in (1, 4):
        raw_topic = new_topic(servers, "raw", partitions)
        our_topic = new_topic(servers, "client", partitions, key=("/id",))
        peer = timed("raw", len(docs), lambda t=raw_topic: raw_produce(servers, t, docs))
        ours = timed("client", len(docs), lambda t=our_topic: client_publish(servers, t, docs))
        report(f"publish, persisted acks, {partitions} partition(s)", ours, peer, 0.8)
        peer = timed(
            "raw",
            len(docs),
            lambda t=raw_topic, p=partitions: raw_consume(servers, t, p, len(docs)),
        )
        ours = timed("client", len(docs), lambda t=our_topic: client_replay(servers, t, len(docs)))
        report(f"bookmark_subscribe from EPOCH, {partitions} partition(s)", ours, peer, 0.7)


if __name__ == "__main__":
    main()
