"""The local Spark JVM logs through the package's log4j2 config: warnings only, without
the banner and the native-hadoop warning Spark's defaults print on every job's stderr."""

from __future__ import annotations

from pathlib import Path

from amps_on_kafka.spark.session import LOG4J


def test_the_local_jvm_logs_through_the_package_config(spark):
    jvm = spark.sparkContext._jvm
    assert jvm.System.getProperty("log4j2.configurationFile") == LOG4J
    assert Path(LOG4J.removeprefix("file://")).is_file()  # shipped beside session.py
    logs = jvm.org.apache.logging.log4j.LogManager
    assert str(logs.getRootLogger().getLevel()) == "WARN"
    native = logs.getLogger("org.apache.hadoop.util.NativeCodeLoader")
    assert str(native.getLevel()) == "ERROR"
