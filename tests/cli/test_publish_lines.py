"""`amps-kafka publish` reads stdin a bounded line at a time (--max-line-bytes)."""

from __future__ import annotations

import io

import pytest
from click.testing import CliRunner
from hypothesis import given
from hypothesis import strategies as st

from amps_on_kafka.cli import main
from amps_on_kafka.cli.publish import stdin_lines
from amps_on_kafka.errors import MessageError
from amps_on_kafka.log.message import Completed
from amps_on_kafka.log.replay import Replay

_LINE = st.binary(max_size=12).map(lambda b: b.replace(b"\n", b"").replace(b"\r", b""))


@given(st.lists(_LINE, max_size=8), st.integers(1, 10), st.sampled_from([b"\n", b"\r\n"]))
def test_lines_come_with_their_number_or_the_first_bad_one_is_named(
    lines: list[bytes], limit: int, end: bytes
) -> None:
    stream = io.BytesIO(end.join(lines))
    bad = next((n for n, line in enumerate(lines, 1) if len(line) > limit or _not_text(line)), None)
    if bad is None:
        expected = [(n, ln.decode().strip()) for n, ln in enumerate(lines, 1) if ln.strip()]
        assert list(stdin_lines(stream, limit)) == [(n, t) for n, t in expected if t]
        return
    with pytest.raises(MessageError, match=f"^line {bad}: "):
        list(stdin_lines(stream, limit))
    assert stream.tell() <= sum(len(line) + len(end) for line in lines[:bad]) + limit + 2


def _not_text(line: bytes) -> bool:
    try:
        line.decode()
    except UnicodeDecodeError:
        return True
    return False


def test_a_line_past_max_line_bytes_stops_the_command_naming_it(
    bootstrap, topic_factory, monkeypatch
) -> None:
    monkeypatch.setenv("KAFKA_BOOTSTRAP_SERVERS", bootstrap)
    topic = topic_factory(1)
    stdin = '{"id": 1}\n\n{"id": 2}\n{"id": 3, "pad": "' + "x" * 100 + '"}\n{"id": 4}\n'
    result = CliRunner().invoke(main, ["publish", topic, "--max-line-bytes", "50"], input=stdin)
    assert result.exit_code == 1
    assert "line 4: longer than 50 bytes (--max-line-bytes)" in result.output
    assert "(2 message(s) published)" in result.output
    published = []
    with Replay(bootstrap, topic, "0") as replay:
        for message in replay:
            if isinstance(message, Completed):
                break
            published.append(message.data["id"])
    assert published == [1, 2]
