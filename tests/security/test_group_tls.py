"""Two workers of one group behind TLS, with users, a PeerSecret and entitlements, as an
operator deploys them: each gateway answers a user's query for the whole topic by asking
the other over TLS as `_peer`, and the user's entitlement filter holds on the partitions
the other worker serves. Worker processes started with `amps-kafka worker`.
"""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import pytest
import yaml

from amps_on_kafka.client import Client
from amps_on_kafka.security.users import UsersFile
from amps_on_kafka.server.membership import Directory
from tests.scaling.helpers import DEADLINE, announced, session_timeout
from tests.scaling.workers import WorkerProcess
from tests.security.gateway_fixtures import PASSWORDS, PEER_SECRET, make_certs

pytestmark = pytest.mark.slow  # two worker processes: 10-60 s on a busy 2-core machine


def test_a_group_over_tls_answers_each_user_within_their_entitlements(
    bootstrap: str, topic_factory, tmp_path: Path
) -> None:
    topic = topic_factory(2, key=("/id",))
    config = _config(tmp_path, topic, session_timeout(bootstrap))
    group = f"tls-group-{uuid.uuid4().hex[:8]}"
    workers = [WorkerProcess(f"tls{i}", config, bootstrap, group, tmp_path) for i in range(2)]
    try:
        for worker in workers:
            worker.start()
        addresses = [worker.wait_ready() for worker in workers]
        announced(bootstrap, group, lambda directory: _split(directory, topic))
        desks = {f"g-{n}": ("fx" if n % 2 else "rates") for n in range(8)}
        ca = tmp_path / "certs" / "ca.pem"
        with _client(addresses[0], "bob", "bob-publisher", ca) as bob:
            for record_id, desk in desks.items():
                bob.publish(topic, {"id": record_id, "desk": desk})
            bob.publish_flush(30)
        fx = {record_id for record_id, desk in desks.items() if desk == "fx"}
        for address in addresses:
            assert _until_seen(address, "bob", topic, len(desks), ca) == set(desks)
            assert _until_seen(address, "alice", topic, len(fx), ca) == fx
    finally:
        for worker in workers:
            worker.stop()


def _config(tmp_path: Path, topic: str, timeout: float) -> Path:
    certs = make_certs(tmp_path / "certs")
    users = UsersFile(tmp_path / "users.txt")
    for name, password in PASSWORDS.items():
        users.add(name, password)
    config = {
        "Topics": [{"Name": topic, "Partitions": 2}],
        "SOW": [{"Topic": topic, "Key": "/id"}],
        "Worker": {"SessionTimeout": timeout},
        "Gateway": {
            "TLS": {
                "Certificate": str(certs / "gateway.pem"),
                "Key": str(certs / "gateway.key"),
                "CA": str(certs / "ca.pem"),
            }
        },
        "Authentication": {"UsersFile": str(users.path), "PeerSecret": PEER_SECRET},
        "Entitlements": {
            "Users": {
                "alice": {"Read": [{"Topic": topic, "Filter": "/desk = 'fx'"}]},
                "bob": {"Read": [topic], "Write": [topic]},
            }
        },
    }
    path = tmp_path / "group.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def _split(directory: Directory, topic: str) -> bool | None:
    """True once the two partitions are announced by two different workers."""
    owners = {member.worker for member in directory.owners(topic).values()}
    return True if len(directory.owners(topic)) == 2 and len(owners) == 2 else None


def _client(address: str, user: str, name: str, ca: Path) -> Client:
    """A client logged on as `user` to the gateway at `address` (a ready file's URI)."""
    host = address.removeprefix("tcps://").split("/")[0]
    client = Client(name)
    client.connect(f"tcps://{user}:{PASSWORDS[user]}@{host}/amps/json?ca={ca}")
    client.logon(timeout=30)
    return client


def _until_seen(address: str, user: str, topic: str, count: int, ca: Path) -> set[str]:
    """The ids `user` sees in the SOW through `address`, once `count` are there."""
    deadline = time.monotonic() + DEADLINE
    with _client(address, user, f"{user}-{uuid.uuid4().hex[:6]}", ca) as client:
        while True:
            seen = {message.data["id"] for message in client.sow(topic, timeout=30)}
            if len(seen) >= count or time.monotonic() > deadline:
                return seen
            time.sleep(0.2)
