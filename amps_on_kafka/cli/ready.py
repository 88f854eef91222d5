"""The worker's ready file: where a script learns, without parsing a log line, that a
worker serves and at which addresses.

`amps-kafka worker --ready-file PATH` writes one JSON object once the stores have
recovered and the gateway accepts connections: ``{"gateway": "tcp://H:P/amps/json",
"admin": null, "pid": N, "state_dir": DIR}`` (``admin`` is an admin URI when the worker
serves one). It is written to a temporary file beside PATH and renamed, so a reader sees
the whole object or nothing; a stale one is removed at start, and the file is removed
when the worker exits (a SIGKILLed worker leaves it: ``pid`` tells a reader whether it
still runs).
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Any

import orjson


def write_ready_file(path: Path, info: dict[str, Any]) -> None:
    """Write `info` as JSON to `path` atomically (temporary file, fsync, rename)."""
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(temporary, "wb") as out:
        out.write(orjson.dumps(info, option=orjson.OPT_APPEND_NEWLINE))
        out.flush()
        os.fsync(out.fileno())
    os.replace(temporary, path)


def remove_ready_file(path: Path | None) -> None:
    """Remove the ready file if it is there (a stale one, or this worker's at exit)."""
    if path is not None:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
