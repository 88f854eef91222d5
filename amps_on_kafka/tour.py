"""The five-minute tour: topics, publishing through the client, replay from bookmarks.

Run by `scripts/tour.sh` after it has set everything up. Each replay is the real
`amps-kafka replay` command, printed before it runs, so you can try your own.
"""

from __future__ import annotations

import shlex
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import click
import yaml

from amps_on_kafka.broker import resolve_bootstrap
from amps_on_kafka.client import Client
from amps_on_kafka.log.message import COMPLETED

SYMBOLS = ("IBM", "MSFT", "AAPL", "ORCL")
CLI = (sys.executable, "-m", "amps_on_kafka.cli")


def _step(title: str) -> None:
    click.secho(f"\n== {title}", fg="cyan", bold=True)


def _run(*args: str) -> str:
    click.secho("$ amps-kafka " + shlex.join(args[len(CLI) :]), fg="yellow")
    result = subprocess.run(args, capture_output=True, text=True, check=False)
    sys.stdout.write(result.stdout)
    if result.returncode != 0:
        sys.stdout.write(result.stderr)
    return result.stdout


def main() -> None:
    bootstrap = resolve_bootstrap(None, echo=click.echo)
    topic = f"tour.orders.{int(time.time())}"
    cli = CLI

    _step("Create a 4-partition log topic keyed by /id")
    _run(*cli, "topics", "create", topic, "--partitions", "4", "--key", "/id")

    _step("Publish 12 orders through the adapter client (persisted = Kafka acks=all)")
    with Client("tour-publisher") as client:
        client.connect(f"kafka://{bootstrap}")
        client.logon()
        for i in range(12):
            client.publish(topic, {"id": i, "sym": SYMBOLS[i % 4], "qty": 100 * (i + 1)})
        client.publish_flush(30)
        first = _first_message(client, topic)
    click.echo(f"published 12 orders; the first in partition {first.partition} is {first.bookmark}")

    _step("Replay everything from EPOCH (0)")
    _run(*cli, "replay", topic, "--bookmark", "0")

    _step("Replay after one message's bookmark (its partition resumes after it)")
    _run(*cli, "replay", topic, "--bookmark", first.bookmark)

    _step("Replay from a moment in time, and with a content filter")
    moment = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(first.timestamp / 1000))
    _run(*cli, "replay", topic, "--bookmark", moment, "--filter", "/sym = 'IBM' OR /qty > 1000")

    _step("What a bookmark means, partition by partition")
    _run(*cli, "bookmark", "resolve", topic, first.bookmark)

    _step("NOW (0|1|) replays nothing: only what comes next")
    _run(*cli, "replay", topic, "--bookmark", "0|1|")

    _sow_tour(bootstrap, topic)
    click.secho("\nDone. Try: amps-kafka --help", fg="green")


def _sow_tour(bootstrap: str, topic: str) -> None:
    """A worker keeps the SOW of the topic; the client queries and updates it over tcp."""
    _step("Start a worker: the State of the World of the topic, served on a gateway")
    with tempfile.TemporaryDirectory() as workdir:
        config = Path(workdir) / "tour.yaml"
        config.write_text(
            yaml.safe_dump(
                {
                    "Topics": [{"Name": topic, "Partitions": 4}],
                    "SOW": [{"Topic": topic, "Key": "/id", "Expiration": "enabled"}],
                    # a local trial: anyone may log on (docs/security.md secures it)
                    "Authentication": {"Anonymous": True},
                }
            )
        )
        listen = f"127.0.0.1:{_free_port()}"
        command = [*CLI, "worker", "--config", str(config), "--state-dir", f"{workdir}/state"]
        click.secho(
            "$ amps-kafka " + shlex.join([*command[len(CLI) :], "--listen", listen]), fg="yellow"
        )
        worker = subprocess.Popen(
            [*command, "--listen", listen, "--bootstrap", bootstrap, "--log-level", "WARNING"],
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            _wait_ready(worker)
            _query_the_sow(f"tcp://{listen}/amps/json", topic)
            _step("The same query from the shell")
            _run(
                *CLI,
                "sow",
                topic,
                "--server",
                f"tcp://{listen}/amps/json",
                "--filter",
                "/qty > 1000",
            )
        finally:
            worker.terminate()
            worker.wait(30)


def _query_the_sow(uri: str, topic: str) -> None:
    with Client("tour-viewer") as client:
        client.connect(uri)
        client.logon()
        client.delta_publish(topic, {"id": 1, "qty": 4200})
        client.publish(topic, {"id": 99, "sym": "TMP", "qty": 1}, expiration=5)
        # A delete by filter goes to every partition; its processed ack comes once every
        # partition applied it, and with it everything published before it.
        ack = client.sow_delete(topic, "/sym = 'ORCL'")
        click.echo("delta_publish id 1 (qty 4200); publish id 99 living 5 s; delete every ORCL")
        click.echo(f"  the sow_delete ack says {ack.matches} records were deleted")
        for record in client.sow(topic, "/id IN (1, 99)", order_by="/id"):
            click.echo(f"  sow: key {record.sow_key} {record.data} at {record.bookmark}")
        count = sum(1 for _ in client.sow(topic))
        click.echo(f"  the SOW holds {count} records: 12 orders less 3 ORCL, and id 99 while alive")


def _wait_ready(worker: subprocess.Popen) -> None:
    for line in worker.stderr:  # type: ignore[union-attr]
        if "worker ready" in line:
            click.echo(line.strip())
            return
    raise click.ClickException(f"the worker stopped before it was ready (exit {worker.wait()})")


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _first_message(client: Client, topic: str):
    with client.bookmark_subscribe(topic, "0") as stream:
        return next(m for m in stream if m is not COMPLETED)


if __name__ == "__main__":
    main()
