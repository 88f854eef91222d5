"""The data pipeline on Spark: historical SOW, export to Parquet, cold rebuild of stores.

Imports PySpark; only amps_on_kafka.cli.spark imports this package, and lazily, so the
rest of the project (and `amps-kafka --help`) never starts a JVM.
"""
