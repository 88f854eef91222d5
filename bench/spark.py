"""Issue 7 benchmark: cold rebuild on Spark beside the worker's own rebuild from the log.

    python -m bench spark [--messages 500000] [--keys 100000] [--partitions 2] [--master local[2]]

The same topic is rebuilt three ways in one run: by a worker replaying it from EPOCH
into an empty state directory, by `amps-kafka spark rebuild` (rebuild_stores) into
another, and, for reference, read by raw confluent-kafka (consume and decode only).
The Spark time excludes starting the session and its Python workers (printed apart): a
long-lived session or a cluster has them running.
"""

from __future__ import annotations

import argparse
import tempfile
import time

from amps_on_kafka.log.kafka import end_offsets
from amps_on_kafka.processor.worker import Worker
from amps_on_kafka.spark.plan import plan_as_of
from amps_on_kafka.spark.rebuild import rebuild_stores
from amps_on_kafka.spark.session import spark_session
from amps_on_kafka.spark.sow import job_from_config
from bench.common import Result, bootstrap, documents, new_topic, report
from bench.log import raw_consume
from bench.sow import fill, run_until_caught_up, sow_config


def worker_rebuild(servers: str, topic: str, partitions: int, messages: int) -> tuple[Result, int]:
    with tempfile.TemporaryDirectory() as state:
        worker = Worker(sow_config(topic, partitions), servers, state, group_id=f"bench-{topic}")
        seconds = run_until_caught_up(worker, topic, end_offsets(servers, topic))
        count = sum(s.count() for s in worker.engine.stores())
        worker.stop()
    return Result("worker", seconds, messages), count


def spark_rebuild(
    servers: str, topic: str, partitions: int, messages: int, master: str
) -> tuple[Result, int]:
    job = job_from_config(sow_config(topic, partitions), topic)
    started = time.perf_counter()
    with spark_session(
        master, app_name="bench-spark", shuffle_partitions=partitions, progress=False
    ) as spark:
        spark.range(2, numPartitions=2).mapInArrow(lambda batches: batches, "id long").count()
        print(
            f"# SparkSession ({master}) started in {time.perf_counter() - started:.1f}s", flush=True
        )
        with tempfile.TemporaryDirectory() as state:
            start = time.perf_counter()
            stores = rebuild_stores(spark, servers, job, plan_as_of(servers, topic, "0|1|"), state)
            seconds = time.perf_counter() - start
    return Result("spark", seconds, messages), sum(s.records for s in stores)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench spark")
    parser.add_argument("--messages", type=int, default=500_000)
    parser.add_argument("--keys", type=int, default=100_000)
    parser.add_argument("--partitions", type=int, default=2)
    parser.add_argument("--master", default="local[2]")
    args = parser.parse_args(argv)
    servers = bootstrap()
    topic = new_topic(servers, "spark", args.partitions, key=("/id",))
    fill(servers, topic, documents(args.messages, args.keys))
    print(f"# {args.messages:,} publishes over {args.keys:,} keys, {args.partitions} partitions")
    raw = raw_consume(servers, topic, args.partitions, args.messages)
    worker, worker_count = worker_rebuild(servers, topic, args.partitions, args.messages)
    spark, spark_count = spark_rebuild(servers, topic, args.partitions, args.messages, args.master)
    assert spark_count == worker_count, (spark_count, worker_count)
    report("cold rebuild: Spark job vs the worker's replay", spark, worker)
    report("cold rebuild: Spark job vs raw consume", spark, raw)
    report("cold rebuild: the worker's replay vs raw consume", worker, raw)


if __name__ == "__main__":
    main()
