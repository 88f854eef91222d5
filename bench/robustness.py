"""Issue 13 (defects 5 and 6): the worker's memory under a query flood and a Kafka outage.

    python -m bench robustness [--records 100] [--queries 10000] [--flood-seconds 10]
                               [--publishers 3] [--outage-seconds 20 [20 40 ...]]
                               [--publish-timeout 10]
                               [--only flood|outage|slow] [--outage-target sow|log|both]
                               [--slow-subscribers 8] [--slow-records 1500]
                               [--max-buffered-bytes BYTES]

The worker is the real `amps-kafka worker`, in a process of its own, so its resident
memory (VmRSS) is the worker's alone; the clients run here. Each scenario reports the
worker's RSS before, at its peak during, and after, and the heartbeat round trips
another client saw meanwhile (median, 99th percentile, worst).

- flood: one connection sends `--queries` pipelined `sow` frames (each answered with
  `--records` records) and never reads a reply. Before issue 13 this took the worker
  from about 60 to 760 MiB (638 MiB kept after the close) and other clients waited 1.6 s.
- outage: `--publishers` connections publish without pause (each publish asking for a
  persisted ack) to a broker of the benchmark's own, which is stopped for
  `--outage-seconds` and started again. Reported: the acks (persisted / failed with a
  reason / never answered). Before issue 13 three publishers took the worker from 64 to
  707 MiB. `--publish-timeout` is the worker's Gateway PublishTimeout (30 s by default in
  a config; shorter here so the run is short). The outage runs twice by default, with a
  fresh worker each time: publishing to a SOW topic (the worker also writes what it
  applies to RocksDB, whose memtables grow up to their flush size and stay) and to a
  plain log topic of the same worker (no SOW: only the gateway's memory), so the two
  causes of a higher RSS after the outage can be told apart. Several `--outage-seconds`
  make several outages in a row against the same worker (one of each length), and the
  RSS after each later one is compared with the RSS after the first: what an outage
  leaves behind must not grow with their number or their length.
- slow: `--slow-subscribers` connections subscribe to a SOW topic and never read while a
  kafka:// client publishes `--slow-records` records of 200 KB (50 keys). Reported: how
  many of them the gateway cut as slow consumers (MaxQueuedBytes per connection,
  MaxBufferedBytes for all: `--max-buffered-bytes`, else the default), and the RSS with
  them open and after they are closed. Before the gateway-wide bound, 8 took a worker
  from 69 MiB to 1.7 GiB (2.0 GiB peak).
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path

import orjson
import yaml
from confluent_kafka.admin import AdminClient

from amps_on_kafka.broker.local import LocalBroker
from amps_on_kafka.broker.testing import free_ports
from amps_on_kafka.client import Client
from amps_on_kafka.log.registry import TopicRegistry
from amps_on_kafka.protocol.frames import FrameDecoder, encode_frame
from bench.common import bootstrap, documents, new_topic

MiB = 1024 * 1024
READY_TIMEOUT = 120.0


def rss_mib(pid: int) -> float:
    """The process's resident memory, from /proc (Linux)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


@contextmanager
def worker(
    servers: str,
    topic: str,
    publish_timeout: float,
    log_topic: str | None = None,
    gateway: dict[str, object] | None = None,
) -> Iterator[tuple[int, str]]:
    """`amps-kafka worker` on a free port, serving `topic`'s SOW (and `log_topic`, a topic
    without a SOW, when given), with more `gateway` settings; yields (pid, address)."""
    work = Path(tempfile.mkdtemp(prefix="bench-robustness-"))
    config = {
        "Topics": [{"Name": name} for name in (topic, log_topic) if name is not None],
        "SOW": [{"Topic": topic, "Key": "/id"}],
        "Gateway": {"PublishTimeout": f"{publish_timeout:g}s", **(gateway or {})},
        "Authentication": {"Anonymous": True},
    }
    (work / "config.yaml").write_text(yaml.safe_dump(config))
    address = f"127.0.0.1:{free_ports(1)[0]}"
    command = [
        *(sys.executable, "-m", "amps_on_kafka.cli", "worker", "-b", servers),
        *("--config", str(work / "config.yaml"), "--state-dir", str(work / "state")),
        *("--listen", address, "--log-level", "error"),
    ]
    process = subprocess.Popen(command, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + READY_TIMEOUT
        while "worker ready" not in (process.stderr.readline() or "worker ready"):
            if time.monotonic() > deadline:
                raise RuntimeError("the worker did not get ready")
        if process.poll() is not None:
            raise RuntimeError(f"the worker exited with {process.returncode}")
        threading.Thread(target=process.stderr.read, daemon=True).start()  # keep it drained
        yield process.pid, address
    finally:
        process.terminate()
        process.wait(30)
        shutil.rmtree(work, ignore_errors=True)


@dataclass
class Watch:
    """Samples the worker's RSS and a bystander's heartbeat round trips until stopped."""

    pid: int
    address: str
    rss: list[float] = field(default_factory=list)
    latencies: list[float] = field(default_factory=list)
    worst_at: float = 0.0  # seconds after the watch began
    stop: threading.Event = field(default_factory=threading.Event)

    def __post_init__(self) -> None:
        self._threads = [threading.Thread(target=t, daemon=True) for t in (self._rss, self._beat)]

    def __enter__(self) -> Watch:
        self.began = time.monotonic()
        for thread in self._threads:
            thread.start()
        return self

    def since(self) -> float:
        return time.monotonic() - self.began

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for thread in self._threads:
            thread.join(30)

    def _rss(self) -> None:
        while not self.stop.wait(0.1):
            self.rss.append(rss_mib(self.pid))

    def _beat(self) -> None:
        with Client("bench-bystander") as client:
            client.connect(f"tcp://{self.address}/amps/json")
            client.logon()
            while not self.stop.wait(0.05):
                start = time.perf_counter()
                client.heartbeat()
                latency = time.perf_counter() - start
                if latency > max(self.latencies, default=0):
                    self.worst_at = self.since()
                self.latencies.append(latency)


def settle(pid: int, seconds: float = 5.0) -> float:
    """RSS once the worker had `seconds` to let go of what it no longer needs."""
    time.sleep(seconds)  # a benchmark's pause: memory has no event to wait for
    return rss_mib(pid)


def show(label: str, before: float, watch: Watch, after: float) -> None:
    lat = sorted(watch.latencies) or [float("nan")]
    p99 = lat[min(len(lat) - 1, int(len(lat) * 0.99))]
    print(
        f"{label:8} RSS before {before:6.0f} MiB, peak during {max(watch.rss, default=0):6.0f} "
        f"MiB, after {after:6.0f} MiB | bystander heartbeat median "
        f"{statistics.median(lat) * 1000:6.1f} ms, p99 {p99 * 1000:6.1f} ms, "
        f"worst {lat[-1] * 1000:6.1f} ms at {watch.worst_at:.1f} s ({len(lat)} beats)",
        flush=True,
    )


def connect(address: str, name: str) -> socket.socket:
    host, _, port = address.rpartition(":")
    sock = socket.create_connection((host, int(port)))
    sock.sendall(encode_frame({"c": "logon", "cid": "logon", "client_name": name}))
    return sock


def fill(address: str, topic: str, records: int) -> None:
    with Client("bench-fill") as client:
        client.connect(f"tcp://{address}/amps/json")
        client.logon()
        for doc in documents(records, keys=records):
            client.publish(topic, doc)
        client.publish_flush(60)
        deadline = time.monotonic() + 60
        while len(list(client.sow(topic))) < records:
            assert time.monotonic() < deadline, "the worker did not apply the records"


def flood(servers: str, args: argparse.Namespace) -> None:
    topic = new_topic(servers, "robustness-flood", 1, key=("/id",))
    with worker(servers, topic, args.publish_timeout) as (pid, address):
        fill(address, topic, args.records)
        before = settle(pid, 2)
        sock = connect(address, "bench-flood")
        frames = b"".join(
            encode_frame({"c": "sow", "cid": str(n), "t": topic}) for n in range(args.queries)
        )
        sender = threading.Thread(target=_send_quietly, args=(sock, frames), daemon=True)
        with Watch(pid, address) as watch:
            sender.start()
            time.sleep(args.flood_seconds)  # the flood goes on, unread, this long
        sock.close()
        show("flood", before, watch, settle(pid))


def _send_quietly(sock: socket.socket, data: bytes) -> None:
    with suppress(OSError):  # fails once we close
        sock.sendall(data)  # blocks while the gateway paces us


def slow(servers: str, args: argparse.Namespace) -> None:
    topic = new_topic(servers, "robustness-slow", 2, key=("/id",))
    try:
        slow_run(servers, topic, args)
    finally:  # 300 MB of records: not left on the broker
        admin = AdminClient({"bootstrap.servers": servers})
        for deleted in admin.delete_topics([topic]).values():
            deleted.result(30)  # the request is sent before this process exits
        TopicRegistry(servers).unregister(topic)


def slow_run(servers: str, topic: str, args: argparse.Namespace) -> None:
    gateway = {"MaxBufferedBytes": args.max_buffered_bytes} if args.max_buffered_bytes else {}
    with worker(servers, topic, args.publish_timeout, gateway=gateway) as (pid, address):
        before = settle(pid, 2)
        subscribers = [connect(address, f"bench-slow-{n}") for n in range(args.slow_subscribers)]
        for n, sock in enumerate(subscribers):
            sock.sendall(encode_frame({"c": "subscribe", "cid": "s", "t": topic, "sub_id": str(n)}))
        with Watch(pid, address) as watch, Client("bench-slow-publisher") as client:
            client.connect(f"kafka://{servers}")
            client.logon()
            blob = "x" * 200_000
            for n in range(args.slow_records):
                client.publish(topic, {"id": n % 50, "blob": blob})
            client.publish_flush(120)
            open_rss = settle(pid)  # the worker applies and fans out meanwhile
        cut = sum(_closed(sock) for sock in subscribers)
        for sock in subscribers:
            sock.close()
        show("slow", before, watch, settle(pid))
        print(
            f"         {cut} of {len(subscribers)} cut as slow consumers; RSS {open_rss:.0f} MiB "
            "5 s after the publishes, the others still open",
            flush=True,
        )


def _closed(sock: socket.socket) -> bool:
    """Whether the gateway closed this connection (what it still had is read and dropped)."""
    sock.settimeout(2.0)
    try:
        while sock.recv(1 << 20):
            pass
    except TimeoutError:
        return False
    except OSError:  # reset
        pass
    return True


class Publisher:
    """A connection publishing without pause, counting the answers it gets: persisted
    acks, and failures (persisted, or processed when the publish could not be sent)."""

    def __init__(self, address: str, topic: str, name: str) -> None:
        self.sock = connect(address, name)
        self.topic = topic
        self.sent = 0
        self.acks: Counter[str] = Counter()
        self.stop = threading.Event()
        self.reasons: Counter[str] = Counter()
        self._threads = [threading.Thread(target=t, daemon=True) for t in (self._send, self._read)]
        for thread in self._threads:
            thread.start()

    def _send(self) -> None:
        doc = documents(1)[0]
        while not self.stop.is_set():
            burst = []
            for _ in range(100):
                header = {"c": "publish", "cid": str(self.sent), "t": self.topic, "a": "persisted"}
                burst.append(encode_frame(header, orjson.dumps({**doc, "id": self.sent % 1000})))
                self.sent += 1
            self.sock.sendall(b"".join(burst))
        self.sock.sendall(encode_frame({"c": "flush", "cid": "flush", "a": "processed"}))

    def _read(self) -> None:
        decoder = FrameDecoder(1 << 30)
        while data := self.sock.recv(1 << 16):
            for frame in decoder.feed(data):
                header = frame.header
                if header.get("cid") == "flush":
                    return
                if header.get("a") == "persisted" or header["status"] == "failure":
                    self.acks[header["status"]] += 1
                    if "reason" in header:
                        self.reasons[header["reason"].split(":")[0]] += 1

    def finish(self) -> None:
        self.stop.set()
        for thread in self._threads:
            thread.join(120)
        self.sock.close()


def outage(args: argparse.Namespace) -> None:
    data_dir = Path(tempfile.mkdtemp(prefix="bench-outage-"))
    port, controller_port = free_ports(2)
    broker = LocalBroker(data_dir, port=port, controller_port=controller_port)
    servers = broker.start()
    try:
        targets = ("sow", "log") if args.outage_target == "both" else (args.outage_target,)
        for target in targets:
            outage_once(broker, servers, target, args)
    finally:
        broker.stop()
        shutil.rmtree(data_dir, ignore_errors=True)


def outage_once(broker: LocalBroker, servers: str, target: str, args: argparse.Namespace) -> None:
    """Outages of `--outage-seconds` each, one after the other against the same worker, the
    publishers writing to its SOW topic or to its log topic; the RSS after each tells
    whether what an outage leaves behind grows with their number or their length."""
    sow_topic = new_topic(servers, "robustness-outage", 1, key=("/id",))
    log_topic = new_topic(servers, "robustness-outage-log", 1)
    topic = sow_topic if target == "sow" else log_topic
    with worker(servers, sow_topic, args.publish_timeout, log_topic) as (pid, address):
        before = settle(pid, 2)
        afters = []
        for number, seconds in enumerate(args.outage_seconds, 1):
            label = f"outage {number} of {seconds:g} s ({target} topic)"
            afters.append(one_outage(broker, pid, address, topic, seconds, label, before, args))
        print(f"         RSS {settle(pid, 25):.0f} MiB 30 s after", flush=True)
        if len(afters) > 1:
            growth = ", ".join(f"{after - afters[0]:+.0f}" for after in afters[1:])
            print(f"         RSS after each later outage minus after the first: {growth} MiB")


def one_outage(
    broker: LocalBroker,
    pid: int,
    address: str,
    topic: str,
    seconds: float,
    label: str,
    before: float,
    args: argparse.Namespace,
) -> float:
    """Publishers at full speed through an outage of `seconds`; returns the RSS after."""
    with Watch(pid, address) as watch:
        publishers = [Publisher(address, topic, f"bench-pub-{n}") for n in range(args.publishers)]
        time.sleep(3)  # publishing normally first
        broker.stop()
        stopped = watch.since()
        time.sleep(seconds)  # the outage lasts this long
        broker.start()
        started = watch.since()
        time.sleep(3)
        for publisher in publishers:
            publisher.finish()
    after = settle(pid)
    show(label, before, watch, after)
    print(f"         broker stopped at {stopped:.1f} s, answering again at {started:.1f} s")
    sent = sum(p.sent for p in publishers)
    acks = sum((p.acks for p in publishers), Counter())
    reasons = sum((p.reasons for p in publishers), Counter())
    print(
        f"         {sent} publishes: {acks['success']} persisted, {acks['failure']} "
        f"failed with a reason ({dict(reasons)}), "
        f"{sent - acks['success'] - acks['failure']} unanswered",
        flush=True,
    )
    return after


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench robustness")
    parser.add_argument("--records", type=int, default=100)
    parser.add_argument("--queries", type=int, default=10_000)
    parser.add_argument("--flood-seconds", type=float, default=10.0)
    parser.add_argument("--publishers", type=int, default=3)
    parser.add_argument(
        "--outage-seconds",
        type=float,
        nargs="+",
        default=[20.0],
        help="one outage of each length, in turn, against the same worker (e.g. 20 20 40)",
    )
    parser.add_argument("--publish-timeout", type=float, default=10.0)
    parser.add_argument("--slow-subscribers", type=int, default=8)
    parser.add_argument("--slow-records", type=int, default=1500)
    parser.add_argument("--max-buffered-bytes", type=int, help="Gateway MaxBufferedBytes")
    parser.add_argument("--only", choices=("flood", "outage", "slow"))
    parser.add_argument("--outage-target", choices=("sow", "log", "both"), default="both")
    args = parser.parse_args(argv)
    print(f"worker RSS (VmRSS of the worker process), {os.cpu_count()} cores", flush=True)
    if args.only in (None, "flood"):
        flood(bootstrap(), args)
    if args.only in (None, "slow"):
        slow(bootstrap(), args)
    if args.only in (None, "outage"):
        outage(args)
