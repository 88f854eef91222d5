"""The admin port as an operator uses it: Prometheus text scraped and parsed while the
worker serves publishes, queries, subscriptions and queue traffic; /health and /ready;
the /admin view and `amps-kafka stats`; the applied offsets in Kafka's own view of the
consumer group."""

from __future__ import annotations

import base64
import http.client
import json
import re
import shutil
import socket
import subprocess
from urllib.error import HTTPError, URLError
from urllib.request import Request, urlopen

import pytest
from click.testing import CliRunner
from confluent_kafka import ConsumerGroupTopicPartitions, Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from amps_on_kafka.admin import AdminServer, BasicAuth, Sources, not_ready
from amps_on_kafka.cli import main
from amps_on_kafka.client import Client
from amps_on_kafka.config import Config
from amps_on_kafka.config.model import AdminConfig
from amps_on_kafka.log.kafka import end_offsets
from amps_on_kafka.security.policy import Security
from amps_on_kafka.security.users import UsersFile
from amps_on_kafka.server.gateway import Gateway
from tests.admin.conftest import Metrics, Operated, until

EVERY_METRIC = {
    "amps_records_applied_total",
    "amps_sow_expired_total",
    "amps_dead_letter_failures_total",
    "amps_changelog_failures_total",
    "amps_changelog_lost_total",
    "amps_records_rejected_total",
    "amps_worker_up",
    "amps_partition_applied_offset",
    "amps_partition_end_offset",
    "amps_partition_lag",
    "amps_sow_records",
    "amps_sow_partitions",
    "amps_gateway_sessions",
    "amps_gateway_subscriptions",
    "amps_gateway_connections_total",
    "amps_gateway_refused_total",
    "amps_gateway_slow_consumers_total",
    "amps_gateway_frames_in_total",
    "amps_gateway_frames_out_total",
    "amps_gateway_bytes_in_total",
    "amps_gateway_bytes_out_total",
    "amps_publish_persisted_seconds_count",
    "amps_publish_persisted_seconds_bucket",
    "amps_query_seconds_count",
    "amps_query_seconds_sum",
    "amps_queue_depth",
    "amps_queue_leased",
    "amps_queue_waiting",
    "amps_queue_delivered_total",
    "amps_queue_redelivered_total",
    "amps_queue_acked_total",
    "amps_queue_expired_total",
    "amps_queue_dead_lettered_total",
    "amps_queue_skipped_total",
    "amps_uptime_seconds",
}


def traffic(operated: Operated) -> Metrics:
    """Publishes (one expiring, one bad record from a foreign producer), a query, a
    subscription that stays open, and queue messages: one cancelled (so delivered again)
    then acked, two acked, one expired (so dead-lettered). Returns a scrape meanwhile."""
    topic, queue = operated.topic, operated.queue
    with Client("admin-traffic") as client:
        client.connect(operated.uri)
        client.logon()
        live = client.subscribe(topic, timeout=10)
        with client.subscribe(queue, timeout=10) as messages:
            for n in range(20):
                client.publish(topic, {"id": n, "n": n})
            client.publish(topic, {"id": "brief"}, expiration=0.2)
            for n in range(4):
                client.publish(queue, {"n": n})
            client.publish_flush()
            until(lambda: len(list(client.sow(topic, "/n >= 0"))) == 20, "20 records applied")
            first = next(iter(messages))
            first.ack("cancel")
            for _ in range(3):
                next(iter(messages)).ack()
            next(iter(messages)).ack("expire")
            client.flush_acks()
            bad = Producer({"bootstrap.servers": operated.worker.bootstrap})
            bad.produce(topic, b"not json", partition=0)
            bad.flush(10)
            until(lambda: operated.worker.expired >= 1, "the brief record's expiration")
            until(lambda: operated.worker.rejected, "the bad record's rejection")
            during = operated.scrape()
        live.close()
    return during


def test_every_metric_moves_the_right_way(operated: Operated, caplog):
    before = operated.scrape()
    during = traffic(operated)
    ends = end_offsets(operated.worker.bootstrap, operated.topic)
    after = until(lambda: _settled(operated, ends), f"queue depth 0 and offsets at {ends}")
    assert after.names() >= EVERY_METRIC, EVERY_METRIC - after.names()
    topic, queue = operated.topic, operated.queue

    def grew(name: str, by: float, **labels: str) -> None:
        assert after(name, **labels) - before(name, **labels) >= by, name

    grew("amps_records_applied_total", 22)  # 20, the expiring one, the bad one
    grew("amps_sow_expired_total", 1)
    grew("amps_records_rejected_total", 1, reason="bad_record", outcome="skipped")
    grew("amps_publish_persisted_seconds_count", 25)
    assert after("amps_publish_persisted_seconds_bucket", le="+Inf") == after(
        "amps_publish_persisted_seconds_count"
    )
    grew("amps_query_seconds_count", 1)
    for name in ("frames_in", "frames_out", "bytes_in", "bytes_out"):
        grew(f"amps_gateway_{name}_total", 10)
    grew("amps_gateway_connections_total", 1)
    assert during("amps_gateway_sessions") >= 1
    assert during("amps_gateway_subscriptions") >= 2  # the SOW topic's and the queue's
    # RocksDB's estimate: 21 puts and the expired record's delete, which it counts
    # twice until a compaction: 19 here, 20 once compacted
    assert 18 <= after("amps_sow_records", topic=topic) <= 21
    assert after("amps_sow_partitions", topic=topic) == 2
    assert during("amps_partition_end_offset", topic=topic, partition="0") >= 0
    grew("amps_queue_delivered_total", 5, queue=queue)  # 4, one of them twice
    grew("amps_queue_redelivered_total", 1, queue=queue)
    grew("amps_queue_acked_total", 3, queue=queue)
    grew("amps_queue_expired_total", 1, queue=queue)
    grew("amps_queue_dead_lettered_total", 1, queue=queue)
    assert during("amps_queue_depth", queue=queue) >= 0
    assert after("amps_queue_depth", queue=queue) == 0
    assert after("amps_worker_up") == 1
    # the anomalies, each logged once with its context
    [dead] = [r for r in caplog.records if getattr(r, "event", None) == "dead_letter"]
    assert (dead.queue, dead.dead_letter_topic) == (queue, f"{queue}-dead")
    [skipped] = [r for r in caplog.records if getattr(r, "event", None) == "skipped"]
    assert (skipped.topic, skipped.partition, skipped.reason) == (topic, 0, "bad_record")


def _settled(operated: Operated, ends: dict[int, int]) -> Metrics | None:
    """The scrape once the queue is empty and every partition is applied to its end."""
    metrics = operated.scrape()
    if metrics("amps_queue_depth", queue=operated.queue) != 0:
        return None
    for partition, end in ends.items():
        labels = {"topic": operated.topic, "partition": str(partition)}
        offsets = [metrics(f"amps_partition_{n}_offset", **labels) for n in ("applied", "end")]
        if offsets != [end, end] or metrics("amps_partition_lag", **labels) != 0:
            return None
    return metrics


def test_health_and_ready(operated: Operated):
    assert operated.json("/health") == (200, {"alive": True, "failed": None})
    assert until(lambda: _ready(operated), "ready") == (200, {"ready": True, "reasons": []})
    assert operated.get("/nowhere")[0] == 404


def _ready(operated: Operated):
    status, body = operated.json("/ready")
    return (status, body) if status == 200 else None


def test_not_ready_names_each_reason(operated: Operated):
    view = operated.admin.sources.view()
    assert not_ready(view, 100) == []
    topic = view["sow_topics"][0]
    topic["partitions"][0]["lag"] = 5000
    topic["partitions"][1]["lag"] = None
    view["queues"][0]["ready"] = False
    view["worker"]["failed"] = "a damaged store"
    reasons = not_ready(view, 100, gateway_expected=True)
    assert reasons == [
        "worker failed: a damaged store",
        f"{topic['topic']}|0: 5000 records behind (ReadyMaxLag 100)",
        f"{topic['topic']}|1: log end not known yet",
        f"queue {operated.queue}: recovering",
    ]
    view["gateway"] = None
    view["worker"]["assigned"] = False
    assert "no partition assigned yet" in not_ready(view, 100)
    assert "the gateway is not serving yet" in not_ready(view, 100)
    view["worker"]["assigned"] = True  # a group with more workers than partitions
    for topic in view["sow_topics"]:
        topic["partitions"] = []
    assert "this worker owns no partition (no store open)" in not_ready(view, 100)


def test_admin_view_and_the_stats_command(operated: Operated):
    with Client("admin-viewer") as client:
        client.connect(operated.uri)
        client.logon()
        with client.subscribe(operated.topic, "/n > 5", sub_id="watch", timeout=5):
            status, view = operated.json("/admin")
            assert status == 200
            [me] = [c for c in view["clients"] if c["name"] == "admin-viewer"]
            assert me["subscriptions"] == ["watch"] and me["bytes_in"] > 0
            assert me["address"].startswith("127.0.0.1:")
            [sub] = [s for s in view["subscriptions"] if s["client"] == "admin-viewer"]
            assert (sub["topic"], sub["filter"]) == (operated.topic, "/n > 5")
            assert view["instance"]["config"]["sow"][0]["topic"] == operated.topic
            assert view["queues"][0]["name"] == operated.queue
            assert [t["topic"] for t in view["sow_topics"]] == [operated.topic]

            runner = CliRunner()
            text = runner.invoke(main, ["stats", "--server", operated.url])
            assert text.exit_code == 0, text.output
            for heading in ("Instance", "SOW topics", "Clients", "Subscriptions", "Queues"):
                assert heading in text.output
            assert "admin-viewer" in text.output and operated.queue in text.output
            raw = runner.invoke(main, ["stats", "--server", operated.url, "--format", "json"])
            assert raw.exit_code == 0, raw.output
            assert "admin-viewer" in {c["name"] for c in json.loads(raw.output)["clients"]}
    refused = CliRunner().invoke(main, ["stats", "--server", "http://127.0.0.1:1"])
    assert refused.exit_code != 0 and "127.0.0.1:1" in refused.output
    gateway = CliRunner().invoke(main, ["stats", "--server", operated.uri])  # tcp://
    assert gateway.exit_code == 2 and "is not an admin port's URL" in gateway.output


def test_stats_escapes_what_a_client_sent(operated: Operated):
    """A filter (or sub_id) is the client's text: `stats` prints its control characters
    escaped, so a client can't clear or recolour the operator's terminal."""
    with Client("admin-escapes") as client:
        client.connect(operated.uri)
        client.logon()
        with client.subscribe(operated.topic, "/n = 'a\x1b[2J\nb'", sub_id="x\x1b[31m", timeout=5):
            shown = CliRunner().invoke(main, ["stats", "--server", operated.url])
    assert shown.exit_code == 0, shown.output
    assert "\x1b" not in shown.output
    assert "x\\x1b[31m" in shown.output and "a\\x1b[2J\\nb" in shown.output


def test_applied_offsets_are_committed_for_kafkas_lag_tools(operated: Operated):
    """Kafka's own view of the worker's group (what kafka-consumer-groups shows): the
    committed offsets reach the log end once the stores have flushed."""
    with Client("admin-lag") as client:
        client.connect(operated.uri)
        client.logon()
        for n in range(10):
            client.publish(operated.topic, {"id": f"lag-{n}", "n": n})
        client.publish_flush()
    bootstrap = operated.worker.bootstrap
    ends = end_offsets(bootstrap, operated.topic)
    admin = AdminClient({"bootstrap.servers": bootstrap})
    wanted = [TopicPartition(operated.topic, p) for p in ends]

    def committed() -> dict[int, int]:
        request = [ConsumerGroupTopicPartitions(operated.group, wanted)]
        result = admin.list_consumer_group_offsets(request)[operated.group].result(10)
        return {tp.partition: tp.offset for tp in result.topic_partitions}

    until(lambda: committed() == ends, f"committed offsets {ends}")


def test_status_page_in_a_headless_browser(operated: Operated, tmp_path):
    """Debian's chromium loads the page from the admin port, runs its script until the
    charts have points drawn (body[data-points]) and the tables name the SOW topic and
    the queue, then takes a screenshot."""
    browser = shutil.which("chromium")
    if browser is None:
        pytest.skip("chromium is not installed (scripts/bootstrap.sh installs it)")
    flags = [
        browser,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--hide-scrollbars",
        f"--user-data-dir={tmp_path / 'profile'}",
        "--virtual-time-budget=3000",
    ]
    with Client("admin-page") as client:  # traffic while the page samples
        client.connect(operated.uri)
        client.logon()
        for n in range(5):
            client.publish(operated.topic, {"id": f"page-{n}", "n": n})
        client.publish_flush()

        def drawn() -> str | None:
            dom = subprocess.run(
                [*flags, "--dump-dom", operated.url + "/"],
                capture_output=True,
                text=True,
                timeout=60,
                check=True,
            ).stdout
            found = re.search(r'data-points="(\d+)"', dom)
            return dom if found and int(found.group(1)) >= 3 else None

        dom = until(drawn, "3 points drawn on the charts", timeout=90)
        assert operated.topic in dom and operated.queue in dom and "admin-page" in dom
    shot = tmp_path / "status.png"
    subprocess.run(
        [*flags, "--window-size=1200,900", f"--screenshot={shot}", operated.url + "/"],
        capture_output=True,
        timeout=60,
        check=True,
    )
    data = shot.read_bytes()
    assert data.startswith(b"\x89PNG\r\n\x1a\n") and len(data) > 10_000


def test_the_port_asks_for_what_the_gateway_asks(operated: Operated, tmp_path):
    """With a users file, every path but /health and /ready wants a user's HTTP Basic
    credentials (stats takes them in its URL); with Anonymous: true, nothing."""
    users = tmp_path / "users"
    UsersFile(users).add("ops", "s3cret-pass")
    secured = Config.model_validate(
        {"Authentication": {"UsersFile": str(users), "FailureDelay": "0s"}}
    )
    settings = AdminConfig(Listen="127.0.0.1:0")
    sources = operated.admin.sources
    with AdminServer(sources, settings, authorize=BasicAuth(Security.from_config(secured))) as a:
        url = f"http://{a.address}"
        refused = _status(url + "/metrics")
        assert refused.code == 401 and "Basic" in refused.headers["WWW-Authenticate"]
        assert _status(url + "/metrics", ("ops", "wrong")).code == 401
        assert _status(url + "/metrics", ("ops", "s3cret-pass")).code == 200
        assert _status(url + "/health").code == 200 and _status(url + "/ready").code == 200
        runner = CliRunner()
        ok = runner.invoke(main, ["stats", "--server", f"http://ops:s3cret-pass@{a.address}"])
        assert ok.exit_code == 0 and "SOW topics" in ok.output
        denied = runner.invoke(main, ["stats", "--server", f"http://ops:nope@{a.address}"])
        assert denied.exit_code == 1 and "401" in denied.output and "nope" not in denied.output
    anonymous = Config.model_validate({"Authentication": {"Anonymous": True}})
    with AdminServer(sources, settings, authorize=BasicAuth(Security.from_config(anonymous))) as a:
        assert _status(f"http://{a.address}/admin").code == 200


def test_the_clients_table_names_the_user_each_logged_on_as(operated: Operated, tmp_path):
    """With authentication, each client's `user` is who it logged on as (the view read
    an attribute sessions don't have, and showed no user)."""
    users = tmp_path / "users"
    UsersFile(users).add("ops", "s3cret-pass")
    secured = Config.model_validate(
        {"Authentication": {"UsersFile": str(users), "FailureDelay": "0s"}}
    )
    worker = operated.worker
    gateway = Gateway(
        worker.engine, worker.bootstrap, listen="127.0.0.1:0",
        security=Security.from_config(secured),
    )  # fmt: skip
    gateway.start()
    try:
        with Client("ops-console") as client:
            client.connect(f"tcp://ops:s3cret-pass@{gateway.address}/amps/json")
            client.logon()
            clients = Sources(worker, gateway).view()["clients"]
        assert [(c["name"], c["user"]) for c in clients] == [("ops-console", "ops")]
    finally:
        gateway.stop()


def _status(url: str, user: tuple[str, str] | None = None):
    request = Request(url)
    if user is not None:
        pair = base64.b64encode(":".join(user).encode()).decode()
        request.add_header("Authorization", f"Basic {pair}")
    try:
        with urlopen(request, timeout=10) as response:
            response.read()
            return response
    except HTTPError as error:
        return error


def test_at_most_max_requests_at_once(operated: Operated):
    """Connections that send nothing hold the port's places; one more is closed
    unanswered; once they go, the port serves again."""
    settings = AdminConfig(Listen="127.0.0.1:0")
    with AdminServer(operated.admin.sources, settings, max_requests=2) as admin:
        host, port = admin.address.rsplit(":", 1)
        idle = [socket.create_connection((host, int(port))) for _ in range(2)]
        try:
            with pytest.raises((URLError, ConnectionError, http.client.HTTPException)):
                urlopen(f"http://{admin.address}/health", timeout=10).read()
        finally:
            for sock in idle:
                sock.close()
        until(lambda: _answers(f"http://{admin.address}/health"), "served again")


def test_one_address_holds_at_most_its_share_of_the_places(operated: Operated):
    """Idle connections from one client take its share (MAX_PER_ADDRESS) and no more:
    its next request is closed unanswered, while a probe from another address (the whole
    of 127/8 is loopback) is still answered."""
    settings = AdminConfig(Listen="127.0.0.1:0")
    with AdminServer(operated.admin.sources, settings, max_requests=4, max_per_address=2) as admin:
        host, port = admin.address.rsplit(":", 1)
        idle = [socket.create_connection((host, int(port))) for _ in range(2)]
        try:
            until(lambda: not _answers(f"http://{admin.address}/health"), "its share is full")
            probe = http.client.HTTPConnection(
                host, int(port), timeout=10, source_address=("127.0.0.2", 0)
            )
            probe.request("GET", "/health")
            assert probe.getresponse().status == 200
            probe.close()
        finally:
            for sock in idle:
                sock.close()


def _answers(url: str) -> bool:
    """Whether the port answers 200 now: one it closes unanswered (its places not yet
    seen free: the idle connections' close reaches it a moment later) has not yet."""
    try:
        return _status(url).code == 200
    except (URLError, ConnectionError, http.client.HTTPException):
        return False
