"""The `amps-kafka` command: one click group, one module per family of sub-commands."""

from __future__ import annotations

EXIT_INTERRUPTED = 130  # 128 + SIGINT, what a shell reports for a command stopped by Ctrl-C
EXIT_BROKEN_PIPE = 141  # 128 + SIGPIPE: the reader of stdout went away (`| head`)

# Loading the sub-commands takes about a second on a busy machine (confluent-kafka,
# pydantic, the filter compiler): Ctrl-C meanwhile ends the command as it would later,
# with exit code 130 and no traceback of the import it interrupted.
try:
    import click

    from amps_on_kafka.cli.bookmark import bookmark
    from amps_on_kafka.cli.broker import broker
    from amps_on_kafka.cli.common import Main
    from amps_on_kafka.cli.config_cmd import config
    from amps_on_kafka.cli.log import log
    from amps_on_kafka.cli.publish import publish
    from amps_on_kafka.cli.queues import queues
    from amps_on_kafka.cli.replay import replay
    from amps_on_kafka.cli.sow import ping, sow, sow_delete, subscribe
    from amps_on_kafka.cli.spark import spark
    from amps_on_kafka.cli.stats import stats
    from amps_on_kafka.cli.topics import topics
    from amps_on_kafka.cli.users import users
    from amps_on_kafka.cli.worker import worker
except KeyboardInterrupt:
    raise SystemExit(EXIT_INTERRUPTED) from None


@click.group(cls=Main, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="amps_on_kafka")
def main() -> None:
    """AMPS-style messaging semantics on Apache Kafka."""


for command in (broker, topics, publish, replay, bookmark, log, worker, sow, subscribe, spark):
    main.add_command(command)
main.add_command(stats)
main.add_command(users)
main.add_command(queues)
for command in (config, sow_delete, ping):
    main.add_command(command)
