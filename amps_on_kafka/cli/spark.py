"""`amps-kafka spark`: the bulk jobs over the log, on Spark (docs/spark.md).

Everything that can be wrong with a command (an unknown topic, a bookmark outside the
log, a bad filter or config, an output that exists) is checked before Spark starts.
PySpark is imported only inside the commands, so `amps-kafka --help` starts no JVM.

Under spark-submit this file is the application: `spark-submit ... amps_on_kafka/cli/spark.py
sow orders --as-of ... --out ...` (the master then comes from spark-submit).
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

import click

from amps_on_kafka.cli.common import bootstrap_option, kafka, reports_errors
from amps_on_kafka.config import Config, load_config
from amps_on_kafka.expr import compile_filter
from amps_on_kafka.processor.startup import StateDirLock

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

master_option = click.option(
    "--master",
    default=None,
    metavar="URL",
    help="Spark master: local[*] (default), local[N], spark://HOST:PORT, yarn, k8s://... "
    "Under spark-submit, its --master.",
)
out_option = click.option(
    "--out", required=True, help="Output directory: a local path or any URL Spark can write."
)
overwrite_option = click.option("--overwrite", is_flag=True, help="Replace --out if it exists.")
config_option = click.option(
    "--config",
    "config_file",
    type=click.Path(path_type=Path, dir_okay=False),
    default=None,
    help="The configuration the workers use: the topic's Key, Expiration and MessageType.",
)


@click.group()
def spark() -> None:
    """Bulk jobs over the log on Spark: historical SOW, export, cold rebuild."""
    if importlib.util.find_spec("pyspark") is None:  # an extra: the tour and workers lack it
        raise click.ClickException(
            "the spark commands need PySpark: install the spark extra "
            "(pip install -e '.[spark]' in the clone) and Java 17+"
        )


@spark.command("sow")
@click.argument("topic")
@click.option(
    "--as-of", "as_of", required=True, help="A bookmark, a list, 0|1| or YYYYmmddTHHMMSSZ."
)
@click.option(
    "--filter", "filter_text", default=None, help='AMPS content filter, e.g. "/qty > 100".'
)
@out_option
@click.option(
    "--format", "fmt", type=click.Choice(["parquet", "jsonl"]), default="parquet", show_default=True
)
@overwrite_option
@config_option
@master_option
@bootstrap_option
@reports_errors
def sow(topic, as_of, filter_text, out, fmt, overwrite, config_file, master, bootstrap) -> None:
    """Write the SOW of TOPIC as it stood at a bookmark or a time.

    Publishes, delta merges, deletes and expirations are applied by the worker's own
    rules. Without --config, the Key paths come from the topic registry and expiration
    is taken as disabled.
    """
    from amps_on_kafka.spark.plan import plan_as_of
    from amps_on_kafka.spark.sow import job_from_config, job_from_registry, sow_frame, write_sow

    config = load_config(config_file) if config_file else None
    servers = _servers(bootstrap, config)
    job = job_from_config(config, topic) if config else job_from_registry(servers, topic)
    if filter_text:
        compile_filter(filter_text)
    _check_out(out, overwrite)
    point = plan_as_of(servers, topic, as_of)
    with _session(master) as session:
        rejected = session.sparkContext.accumulator(0)
        write_sow(
            sow_frame(session, servers, job, point, filter_text, rejected), out, fmt, overwrite
        )
    _report_rejected(rejected.value)
    click.echo(f"{topic}: SOW as of {as_of} ({point.range.records} log records read) -> {out}")


@spark.command("export")
@click.argument("topic")
@click.option(
    "--from",
    "start",
    default="0",
    show_default=True,
    help="Export the records after this bookmark.",
)
@click.option(
    "--to", "stop", default="0|1|", show_default=True, help="Up to and including this bookmark."
)
@out_option
@overwrite_option
@master_option
@bootstrap_option
@reports_errors
def export(topic, start, stop, out, overwrite, master, bootstrap) -> None:
    """Write the log of TOPIC as Parquet, partitioned by date, with bookmark columns."""
    from amps_on_kafka.spark.export import export_log
    from amps_on_kafka.spark.plan import plan_range

    servers = kafka(bootstrap)
    _check_out(out, overwrite)
    log = plan_range(servers, topic, start, stop)
    with _session(master) as session:
        export_log(session, servers, log, out, overwrite=overwrite)
    click.echo(f"{topic}: {log.records} log records exported -> {out}")


@spark.command("rebuild")
@click.argument("topic")
@click.option(
    "--state-dir",
    required=True,
    type=click.Path(path_type=Path, file_okay=False),
    help="The workers' state directory (amps-kafka worker --state-dir).",
)
@click.option(
    "--config",
    "config_file",
    required=True,
    type=click.Path(path_type=Path, dir_okay=False),
    help="The configuration the workers use.",
)
@master_option
@bootstrap_option
@reports_errors
def rebuild(topic, state_dir, config_file, master, bootstrap) -> None:
    """Compute TOPIC's SOW from the log and write the worker's stores under --state-dir.

    A worker started on that state directory resumes at the end of the log the job read,
    without replaying it. Stop the workers using --state-dir first.
    """
    from amps_on_kafka.spark.plan import plan_as_of
    from amps_on_kafka.spark.rebuild import check_unused, rebuild_stores
    from amps_on_kafka.spark.sow import job_from_config

    config = load_config(config_file)
    with StateDirLock(state_dir):  # no worker starts on the stores while they are written
        servers = _servers(bootstrap, config)
        job = job_from_config(config, topic)
        point = plan_as_of(servers, topic, "0|1|")
        check_unused(state_dir, topic, point.range.partitions)
        with _session(master) as session:
            rejected = session.sparkContext.accumulator(0)
            stores = rebuild_stores(session, servers, job, point, state_dir, rejected)
    _report_rejected(rejected.value)
    for store in stores:
        click.echo(
            f"{topic}|{store.partition}| {store.records} records, "
            f"next offset {store.next_offset} -> {store.path}"
        )


def _servers(bootstrap: str | None, config: Config | None) -> str:
    return kafka(bootstrap, config.kafka if config else None)


def _check_out(out: str, overwrite: bool) -> None:
    """A local --out that exists is refused up front, not after Spark read the whole log."""
    if "://" not in out and Path(out).exists() and not overwrite:
        raise click.UsageError(f"--out {out} exists (add --overwrite to replace it)")


@contextmanager
def _session(master: str | None) -> Iterator[SparkSession]:
    """The job's session; a failed Spark job becomes a clear error, not a JVM traceback.
    The progress bar is for a person watching: redrawn with carriage returns, it would
    clutter a script's or a log's capture of stderr."""
    from pyspark.errors import PySparkException

    from amps_on_kafka.spark.session import spark_session

    try:
        with spark_session(master, progress=sys.stderr.isatty()) as session:
            yield session
    except PySparkException as exc:
        raise click.ClickException(f"the Spark job failed: {exc}") from exc


def _report_rejected(count: int) -> None:
    if count:
        click.echo(
            f"{count} log records were rejected by the SOW rules and skipped, "
            "as the worker skips them",
            err=True,
        )


if __name__ == "__main__":
    spark(prog_name="amps-kafka spark")
