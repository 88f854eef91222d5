"""The SparkSession of a pipeline job: local by default, any cluster by its master URL.

The log is read by a Python data source (amps_on_kafka.spark.source), so a job needs no
jar: the session is plain PySpark. Timestamps are handled in UTC whatever the machine's
zone, so export dates and as-of moments mean the same everywhere.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from pyspark.sql import SparkSession

from amps_on_kafka.config.properties import SECRET_KEY

DEFAULT_MASTER = "local[*]"
LOG4J = (Path(__file__).parent / "log4j2.properties").as_uri()  # the local JVM's log config
_SUBMITTED = "PYSPARK_GATEWAY_PORT"  # set by spark-submit for the Python driver it starts


@contextmanager
def spark_session(
    master: str | None = None,
    *,
    app_name: str = "amps-kafka",
    shuffle_partitions: int | None = None,
    progress: bool = True,
) -> Iterator[SparkSession]:
    """A session for one job, stopped at the end; an already active session is reused as is.

    `master` None means what spark-submit was given, else DEFAULT_MASTER. `progress`
    shows Spark's console progress bar (stage and task counts) on stderr.
    """
    active = SparkSession.getActiveSession()
    if active is not None:
        yield active
        return
    session = _builder(master, app_name, shuffle_partitions, progress).getOrCreate()
    try:
        yield session
    finally:
        session.stop()


@contextmanager
def parquet_timestamps_in_micros(spark: SparkSession) -> Iterator[None]:
    """Parquet written meanwhile stores timestamps as TIMESTAMP_MICROS, adjusted to UTC:
    Spark's default is the deprecated INT96, which pyarrow, DuckDB and Trino read only
    with an option or a guess at the time zone. The session's setting is restored after,
    so a notebook's own session keeps its choice for its own writes."""
    key = "spark.sql.parquet.outputTimestampType"
    before = spark.conf.get(key)
    spark.conf.set(key, "TIMESTAMP_MICROS")
    try:
        yield
    finally:
        spark.conf.set(key, before)


def _builder(
    master: str | None,
    app_name: str,
    shuffle_partitions: int | None,
    progress: bool,
) -> SparkSession.Builder:
    settings = {
        "spark.sql.session.timeZone": "UTC",
        "spark.ui.showConsoleProgress": str(progress).lower(),
        # Plans show a read's options; the log source's kafka.<secret> ones (read_log)
        # redacted, as Spark's default does for names with url.
        "spark.sql.redaction.options.regex": f"(?i)url|{SECRET_KEY.pattern}",
    }
    if master is None and _SUBMITTED not in os.environ:
        master = DEFAULT_MASTER
    if master is not None and master.startswith("local"):
        _use_this_machine()
        settings["spark.ui.enabled"] = "false"  # no web server for a job on this machine
        # The JVM starts here: its log is ours (warnings only, no banner); default, not
        # extra, Java options, so a user's own extraJavaOptions still apply after it.
        settings["spark.driver.defaultJavaOptions"] = f"-Dlog4j2.configurationFile={LOG4J}"
    if shuffle_partitions is not None:
        settings["spark.sql.shuffle.partitions"] = str(shuffle_partitions)
    builder = SparkSession.builder.appName(app_name)
    if master is not None:
        builder = builder.master(master)
    for key, value in settings.items():
        builder = builder.config(key, value)
    return builder


def _use_this_machine() -> None:
    """Local master: Python workers run this interpreter (its venv), and Spark binds to
    loopback only. Environment, not conf: the JVM and its planner workers read these."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
