"""The five-minute tour: topics, publishing through the client, replay from bookmarks.

Run by `scripts/tour.sh` after it has set everything up. Each replay is the real
`amps-kafka replay` command, printed before it runs, so you can try your own.
"""

from __future__ import annotations

import shlex
import subprocess
import sys
import time

import click

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
    click.secho("\nDone. Try: amps-kafka --help", fg="green")


def _first_message(client: Client, topic: str):
    with client.bookmark_subscribe(topic, "0") as stream:
        return next(m for m in stream if m is not COMPLETED)


if __name__ == "__main__":
    main()
