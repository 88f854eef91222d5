"""`amps-kafka config`: check a configuration file before a worker meets it, print the
JSON Schema of the format (for editors and CI linters), and write the example
configuration (`config example`, for a user of the wheel, who has no clone's config/).

`config check FILE` changes nothing and needs no Kafka: it lists every problem the file
has, one per line, and exits 1 if there is any. With `--kafka` it also compares the file
with Kafka as a worker's start would (topics missing, another spec registered, a partition
count changed, a DeadLetterTopic missing, a queue pattern matching nothing), still
changing nothing.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

import click

from amps_on_kafka.cli.common import bootstrap_option, echo_json, kafka, reports_errors
from amps_on_kafka.config import Config, load_config
from amps_on_kafka.config.loader import InvalidConfig
from amps_on_kafka.errors import AmpsError
from amps_on_kafka.log.kafka import admin_client, topic_names
from amps_on_kafka.log.registry import TopicRegistry
from amps_on_kafka.log.topics import conflicts_with_kafka, spec_from_config
from amps_on_kafka.processor.dead_letters import dead_letter_topics
from amps_on_kafka.processor.startup import check_serves_something
from amps_on_kafka.security.policy import file_problems, no_logon_note


@click.group("config")
def config() -> None:
    """Check a configuration file; print the configuration's JSON Schema."""


@config.command("check")
@click.argument("file", type=click.Path(path_type=Path))
@click.option(
    "--kafka",
    "with_kafka",
    is_flag=True,
    help="Also compare with Kafka (topics, registry, dead-letter topics), changing nothing.",
)
@bootstrap_option
@reports_errors
def check(file: Path, with_kafka: bool, bootstrap: str | None) -> None:
    """Validate FILE without starting anything: every problem on a line of its own on
    stderr, and exit code 1 if there is any."""
    parsed, problems = _file_problems(file)
    if parsed is not None and with_kafka:
        problems += kafka_problems(parsed, kafka(bootstrap, parsed.kafka))
    if problems:
        for problem in problems:
            click.echo(f"{file}: {problem}", err=True)
        noun = "problem" if len(problems) == 1 else "problems"
        raise click.ClickException(f"{file}: {len(problems)} {noun}")
    assert parsed is not None
    try:
        check_serves_something(parsed, str(file))
    except AmpsError as exc:  # fine for `topics create --config`, not for a worker
        click.echo(f"note: {exc.reason}", err=True)
    if (note := no_logon_note(parsed)) is not None:
        click.echo(f"note: {note}", err=True)
    click.echo(
        f"{file}: valid ({len(parsed.topics)} topics, {len(parsed.sow)} SOW, "
        f"{len(parsed.queues)} queues{', checked with Kafka' if with_kafka else ''})"
    )


def _file_problems(file: Path) -> tuple[Config | None, list[str]]:
    """The parsed config (None if it doesn't validate) and every problem found without
    Kafka: the model's validation errors, then what a worker's start would read (each
    Avro schema)."""
    try:
        parsed = load_config(file)
    except InvalidConfig as exc:
        return None, exc.problems
    except AmpsError as exc:  # unreadable, not YAML: one problem, the file's name in it
        return None, [exc.reason.removeprefix(f"{file}: ")]
    problems = []
    for topic in parsed.topics:
        try:
            spec_from_config(parsed, topic).codec  # noqa: B018 (reads and parses the schema)
        except AmpsError as exc:
            reason = exc.reason
            named = reason.startswith(f"topic {topic.name}: ")
            problems.append(reason if named else f"topic {topic.name}: {reason}")
    return parsed, problems + file_problems(parsed)


def kafka_problems(parsed: Config, servers: str) -> list[str]:
    """What a worker's start or `topics create --config` would refuse in Kafka's state."""
    admin = admin_client(servers)
    existing = set(topic_names(admin, internal=True))
    specs = [spec_from_config(parsed, topic) for topic in parsed.topics]
    problems = conflicts_with_kafka(admin, TopicRegistry(servers), specs)
    problems += [
        f"SOW topic {sow.topic!r} does not exist on Kafka "
        "(create it with amps-kafka topics create --config)"
        for sow in parsed.sow
        if sow.topic not in existing
    ]
    problems += [
        f"{owner}: DeadLetterTopic {target!r} does not exist on Kafka "
        "(create it, or set CreateDeadLetterTopic: true)"
        for owner, target, create in dead_letter_topics(parsed)
        if target not in existing and not create
    ]
    user_topics = [name for name in existing if not name.startswith("_")]
    problems += [
        f"queue {queue.name}: no topic matches {queue.underlying}"
        for queue in parsed.queues
        if not any(queue.views(name) for name in user_topics)
    ]
    return problems


EXAMPLE_FILES = ("example.yaml", "schemas/trade.avsc")  # package data: amps_on_kafka/examples


@config.command("example")
@click.argument("directory", type=click.Path(path_type=Path, file_okay=False), default="config")
@reports_errors
def example(directory: Path) -> None:
    """Write the example configuration into DIRECTORY (default: config): example.yaml and
    the Avro schema it names, so the README's tour runs from an installed wheel as from a
    clone. A file already there is left alone and named (exit code 1)."""
    source = resources.files("amps_on_kafka") / "examples"
    targets = [directory / name for name in EXAMPLE_FILES]
    present = [str(target) for target in targets if target.exists()]
    if present:
        raise click.ClickException(f"nothing written: already there: {', '.join(present)}")
    for name, target in zip(EXAMPLE_FILES, targets, strict=True):
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(source.joinpath(name).read_bytes())
        click.echo(target)


@config.command("schema")
def schema() -> None:
    """Print the JSON Schema of a configuration file (YAML keys as written, e.g. Topics,
    SOW, Gateway), from the models the worker validates with."""
    echo_json(Config.model_json_schema(by_alias=True))
