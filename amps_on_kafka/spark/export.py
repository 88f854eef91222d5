"""Export: a range of the log as Parquet, partitioned by (UTC) date, for analysts.

Every column of the log DataFrame is kept, bookmark and decoded envelope included, so a
query can go from an analyst's result straight back to `amps-kafka replay --bookmark`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pyspark.sql.functions import to_date

from amps_on_kafka.spark.plan import LogRange
from amps_on_kafka.spark.session import parquet_timestamps_in_micros
from amps_on_kafka.spark.source import read_log

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


def export_log(
    spark: SparkSession, bootstrap: str, log: LogRange, out: str, *, overwrite: bool = False
) -> None:
    """Write `log` to `out` as Parquet, one `date=YYYY-MM-DD` directory per day; the
    timestamps as TIMESTAMP_MICROS in UTC."""
    frame = read_log(spark, bootstrap, log).withColumn("date", to_date("timestamp"))
    writer = frame.write.mode("overwrite" if overwrite else "errorifexists")
    with parquet_timestamps_in_micros(spark):
        writer.partitionBy("date").parquet(out)
