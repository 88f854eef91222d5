"""Historical SOW on Spark against the worker's own SOW, at bookmarks and at times."""

from __future__ import annotations

import orjson
import pytest

from amps_on_kafka.spark.plan import plan_as_of
from amps_on_kafka.spark.sow import job_from_config, sow_frame
from tests.spark.conftest import FILTER, History, Snapshot, run_cli


def job_sow(spark, bootstrap: str, history: History, as_of: str) -> Snapshot:
    job = job_from_config(history.config, history.topic)
    frame = sow_frame(spark, bootstrap, job, plan_as_of(bootstrap, history.topic, as_of))
    return {r.sow_key: (bytes(r.payload), r.bookmark) for r in frame.collect()}


def test_the_history_exercises_every_rule(history):
    first, second = (p.sow for p in history.points)
    assert "42" not in first and "5" not in first  # expired (a publish and an update)
    assert "45" in first and "3" not in first and "10" not in first  # never; by key; by filter
    assert orjson.loads(first["40"][0]) == {"id": 40, "qty": 1}  # delta after expiry
    assert orjson.loads(first["13"][0])["note"] == "merged"
    assert orjson.loads(second["1"][0]) == {"id": 1, "qty": 5, "sym": "S1"}
    assert "54" not in second and "8" not in second and "41" in second


@pytest.mark.parametrize("phase", [0, 1])
def test_as_of_a_bookmark_list_is_the_workers_sow(spark, bootstrap, history, phase):
    point = history.points[phase]
    assert job_sow(spark, bootstrap, history, point.bookmark) == point.sow


def test_as_of_a_time_is_the_workers_sow_then(spark, bootstrap, history):
    point = history.points[0]
    assert job_sow(spark, bootstrap, history, point.time) == point.sow


def test_cli_writes_parquet_with_a_filter(spark, bootstrap, history, tmp_path):
    out = str(tmp_path / "sow")
    point = history.points[1]
    run_cli(
        bootstrap,
        "sow",
        history.topic,
        "--as-of",
        point.time,
        "--filter",
        FILTER,
        "--out",
        out,
        "--config",
        str(history.config_file),
    )
    rows = spark.read.parquet(out).collect()
    assert {r.sow_key: (bytes(r.payload), r.bookmark) for r in rows} == point.filtered
    assert {r.data for r in rows} == {p.decode() for p, _ in point.filtered.values()}


def test_cli_writes_json_lines(spark, bootstrap, history, tmp_path):
    out = tmp_path / "sow"
    point = history.points[1]
    output = run_cli(
        bootstrap,
        "sow",
        history.topic,
        "--as-of",
        point.bookmark,
        "--format",
        "jsonl",
        "--out",
        str(out),
        "--config",
        str(history.config_file),
    )
    lines = [
        orjson.loads(line) for part in out.glob("part-*") for line in part.read_bytes().splitlines()
    ]
    expected = point.sow
    assert {x["sow_key"]: (orjson.dumps(x["data"]), x["bookmark"]) for x in lines} == {
        k: (orjson.dumps(orjson.loads(p)), b) for k, (p, b) in expected.items()
    }
    assert all(x["deadline"] is None or x["deadline"] > x["timestamp"] for x in lines)
    assert f"SOW as of {point.bookmark}" in output
