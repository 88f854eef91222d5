"""Issue 14: what the gateway's security costs, beside the same run without it.

    python -m bench security [--records 100000] [--publishes 50000] [--rounds 3]

One worker keeps a SOW topic of `--records` orders; gateways serve it in turn: plain
(tcp://, anonymous), TLS (tcps://, anonymous), entitled (tcp://, a user from a users file
whose Read grant carries the entitlement filter `/qty >= 1`, which every record matches,
so the same records are delivered) and filtered (plain, the client's query carrying that
same filter itself). A client in a spawned process (as an application, with a GIL of its
own) publishes `--publishes` messages to a log topic (then publish_flush) and queries the
whole SOW. Each figure is the best of `--rounds` runs, the variants alternating; the
ratios are secured / plain (1.00 = free), and entitled / filtered: what an entitlement
filter costs beyond the filter it is (a query without any filter sends the stored bytes
without decoding them; any filter decodes every record).
"""

from __future__ import annotations

import argparse
import multiprocessing
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from amps_on_kafka.broker.certs import issue, make_ca, write_pem
from amps_on_kafka.client import Client
from amps_on_kafka.config import Config
from amps_on_kafka.log.kafka import end_offsets
from amps_on_kafka.processor.worker import Worker
from amps_on_kafka.security.policy import Security
from amps_on_kafka.security.users import UsersFile
from amps_on_kafka.server.gateway import Gateway
from bench.common import Result, bootstrap, documents, encoded_size, new_topic, report
from bench.sow import fill, run_until_caught_up

PASSWORD = "bench-password"
ENTITLEMENT_FILTER = "/qty >= 1"  # every bench document matches (qty is 1..1000)
VARIANTS = ("plain", "tls", "entitled", "filtered")


def config(sow_topic: str, log_topic: str, work: Path, variant: str) -> Config:
    section: dict = {
        "Topics": [{"Name": sow_topic}, {"Name": log_topic}],
        "SOW": [{"Topic": sow_topic, "Key": "/id"}],
        "Gateway": {"Listen": "127.0.0.1:0"},
        "Authentication": {"Anonymous": True},
    }
    if variant == "tls":
        section["Gateway"]["TLS"] = {
            "Certificate": str(work / "gateway.pem"),
            "Key": str(work / "gateway.key"),
        }
    if variant == "entitled":
        section["Authentication"] = {"UsersFile": str(work / "users.txt")}
        read = [{"Topic": sow_topic, "Filter": ENTITLEMENT_FILTER}, log_topic]
        section["Entitlements"] = {"Users": {"bench": {"Read": read, "Write": [log_topic]}}}
    return Config.model_validate(section)


def uri(address: str, variant: str, work: Path) -> str:
    if variant == "tls":
        return f"tcps://{address}/amps/json?ca={work / 'ca.pem'}"
    if variant == "entitled":
        return f"tcp://bench:{PASSWORD}@{address}/amps/json"
    return f"tcp://{address}/amps/json"


def client_run(
    uri: str, log_topic: str, sow_topic: str, publishes: int, filter: str | None
) -> tuple[float, float, int]:
    """In the client process: seconds to publish (and flush), seconds to query, records."""
    payload = documents(1)[0]
    with Client(f"bench-security-{time.monotonic_ns()}") as client:
        client.connect(uri)
        client.logon(timeout=30)
        start = time.perf_counter()
        for _ in range(publishes):
            client.publish(log_topic, payload)
        client.publish_flush(300)
        published = time.perf_counter() - start
        start = time.perf_counter()
        records = sum(1 for _ in client.sow(sow_topic, filter, batch_size=1000))
        return published, time.perf_counter() - start, records


def make_files(work: Path) -> None:
    ca = make_ca("bench CA")
    write_pem(ca, work / "ca.pem")
    server = issue(ca, "localhost", ips=["127.0.0.1"])
    write_pem(server, work / "gateway.pem", work / "gateway.key")
    UsersFile(work / "users.txt").add("bench", PASSWORD)


def run_variants(
    servers: str, topics: tuple[str, str], args: argparse.Namespace
) -> dict[str, tuple[float, float]]:
    """Best (publish, query) seconds of each variant over args.rounds alternating runs."""
    sow_topic, log_topic = topics
    best = {v: (float("inf"), float("inf")) for v in VARIANTS}
    spawn = multiprocessing.get_context("spawn")  # never fork a process holding RocksDB
    with (
        tempfile.TemporaryDirectory() as temporary,
        ProcessPoolExecutor(max_workers=1, mp_context=spawn) as client,
    ):
        work = Path(temporary)
        make_files(work)
        plain = config(sow_topic, log_topic, work, "plain")
        worker = Worker(plain, servers, work / "state", group_id=f"bench-{sow_topic}")
        run_until_caught_up(worker, sow_topic, end_offsets(servers, sow_topic))
        try:
            for _ in range(args.rounds):
                for variant in VARIANTS:
                    published, queried = one_run(client, worker, topics, work, variant, args)
                    was = best[variant]
                    best[variant] = (min(was[0], published), min(was[1], queried))
        finally:
            worker.stop()
    return best


def one_run(
    client: ProcessPoolExecutor,
    worker: Worker,
    topics: tuple[str, str],
    work: Path,
    variant: str,
    args: argparse.Namespace,
) -> tuple[float, float]:
    """One variant's gateway over the worker, and the client's publish and query times."""
    sow_topic, log_topic = topics
    settings = config(sow_topic, log_topic, work, variant)
    with Gateway(
        worker.engine,
        worker.bootstrap,
        listen="127.0.0.1:0",
        settings=settings.gateway,
        security=Security.from_config(settings),
    ) as gateway:
        target = uri(gateway.address, variant, work)
        own = ENTITLEMENT_FILTER if variant == "filtered" else None
        run = client.submit(client_run, target, log_topic, sow_topic, args.publishes, own)
        published, queried, records = run.result()
    assert records == args.records, (variant, records)
    return published, queried


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench security")
    parser.add_argument("--records", type=int, default=100_000)
    parser.add_argument("--publishes", type=int, default=50_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    servers = bootstrap()
    print(f"# documents of ~{encoded_size(documents(1)[0])} bytes of JSON, broker {servers}")
    sow_topic = new_topic(servers, "security-sow", 1, key=("/id",))
    log_topic = new_topic(servers, "security-log", 1)
    fill(servers, sow_topic, documents(args.records, args.records))
    best = run_variants(servers, (sow_topic, log_topic), args)
    comparisons = (
        ("tls", "plain", "over tcps:// vs tcp://"),
        ("entitled", "plain", "with an entitlement filter vs none"),
        ("entitled", "filtered", "entitlement filter vs the same filter sent"),
    )
    for index, (what, count) in enumerate([("publish", args.publishes), ("sow", args.records)]):
        for ours, peer, title in comparisons[: 2 if what == "publish" else 3]:  # no filter
            mine = Result(ours, best[ours][index], count)
            report(f"{what} {title}", mine, Result(peer, best[peer][index], count))


if __name__ == "__main__":
    main()
