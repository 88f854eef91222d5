"""Export: the log between two bookmarks as Parquet partitioned by date."""

from __future__ import annotations

from datetime import UTC

import pyarrow as pa
import pyarrow.parquet as pq

from tests.spark.conftest import run_cli


def test_export_between_two_bookmarks(spark, bootstrap, history, tmp_path):
    first, second = history.points
    out = tmp_path / "export"
    run_cli(
        bootstrap,
        "export",
        history.topic,
        "--from",
        first.bookmark,
        "--to",
        second.bookmark,
        "--out",
        str(out),
    )
    rows = spark.read.parquet(str(out)).collect()
    expected = {
        f"{history.topic}|{p}|{o}|" for p in second.end for o in range(first.end[p], second.end[p])
    }
    assert {r.bookmark for r in rows} == expected  # after --from, up to and including --to
    assert all(r.date == r.timestamp.astimezone(UTC).date() for r in rows)
    stored = pq.read_schema(next(out.glob("date=*/*.parquet"))).field("timestamp").type
    assert stored == pa.timestamp("us", tz="UTC")  # TIMESTAMP_MICROS, UTC, not INT96
    assert {d.name for d in out.iterdir() if d.is_dir()} == {
        f"date={r.timestamp.astimezone(UTC).date()}" for r in rows
    }
    by_command = {}
    for row in rows:
        by_command.setdefault(row.command, []).append(row)
    assert len(by_command["delta_publish"]) == 3
    deletes = by_command["sow_delete"]
    assert {r.filter for r in deletes} == {"/qty > 90", None}
    assert [r.sow_keys for r in deletes if r.sow_keys] == [["8"]]
    assert {r.expiration for r in by_command["publish"]} == {0.05, 0.0, None}
    assert all(r.publisher_id and r.sequence for r in rows if r.command)


def test_an_envelope_that_does_not_decode_is_kept_with_its_error(spark, bootstrap, history):
    from amps_on_kafka.spark.plan import plan_range
    from amps_on_kafka.spark.source import read_log

    first = history.points[0]
    log = read_log(spark, bootstrap, plan_range(bootstrap, history.topic, first.bookmark))
    bad = log.where("error IS NOT NULL").collect()
    assert len(bad) == 1
    assert bad[0].command is None and "unknown command 'bogus'" in bad[0].error
    assert [(h.key, bytes(h.value)) for h in bad[0].headers] == [("c", b"bogus")]
