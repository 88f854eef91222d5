"""`amps-kafka queues delete`: what `topics delete` of a queue's topic leaves behind (its
events topic, its consumer groups, the route of its name), refused while a worker runs it."""

from __future__ import annotations

import uuid

from confluent_kafka.admin import AdminClient

from amps_on_kafka.config import load_config
from amps_on_kafka.log.kafka import topic_names
from amps_on_kafka.log.registry import TopicRegistry
from amps_on_kafka.processor.queue_owner import OWNER_GROUP_PREFIX
from amps_on_kafka.processor.queue_recovery import GROUP_PREFIX
from amps_on_kafka.processor.queue_runtime import events_topic
from amps_on_kafka.processor.worker import Worker
from tests.admin.conftest import until
from tests.conftest import delete_topics


def _groups(admin: AdminClient) -> set[str]:
    return {g.group_id for g in admin.list_consumer_groups().result(10).valid}


def test_queues_delete_forgets_a_queue_but_not_while_a_worker_runs_it(run, bootstrap, tmp_path):
    queue = f"cli-queue-{uuid.uuid4().hex[:8]}"
    topic, direct = f"{queue}-topic", f"{queue}_DIRECT"  # publishes to the queue go to direct
    config = tmp_path / "q.yaml"
    config.write_text(
        f"Topics: [{{Name: {topic}}}, {{Name: {direct}}}]\n"
        f"Queues: [{{Name: {queue}, UnderlyingTopic: '^({topic}|{direct})$'}}]\n"
    )
    admin = AdminClient({"bootstrap.servers": bootstrap})
    owner, recovery = f"{OWNER_GROUP_PREFIX}{queue}", f"{GROUP_PREFIX}{queue}"
    try:
        assert run("topics", "create", "--config", str(config)).exit_code == 0
        assert TopicRegistry(bootstrap).entries()[queue].publish_target == direct
        worker = Worker(load_config(config), bootstrap, tmp_path / "state")
        worker.queues.share(worker.config.worker.session_timeout)  # as `amps-kafka worker`
        worker.start()
        try:
            worker.wait_ready()
            until(lambda: owner in _groups(admin), "the queue's owner group")
            running = run("queues", "delete", queue, "--yes")
            assert running.exit_code == 1 and "a worker still runs the queue" in running.output
            assert owner in _groups(admin)  # nothing deleted
        finally:
            worker.stop()  # commits the queue's recovery point
        assert recovery in _groups(admin)
        deleted = run("queues", "delete", queue, "--yes")
        assert deleted.exit_code == 0 and f"{queue}: deleted" in deleted.output
        assert not (_groups(admin) & {owner, recovery})
        assert queue not in TopicRegistry(bootstrap).entries()
        until(lambda: events_topic(queue) not in topic_names(admin, internal=True), "deleted")
        assert {topic, direct} <= set(topic_names(admin))  # the messages stay
        again = run("queues", "delete", queue, "--yes")
        assert again.exit_code == 1 and f"no such queue in Kafka: {queue}" in again.output
    finally:
        delete_topics(bootstrap, [topic, direct, events_topic(queue)])
