"""Writes batches to a store in its own process, then dies without closing it.

python -m tests.sow.store_process PATH BATCHES FLUSH_AFTER WRITE_BUFFER_BYTES

Each batch holds 1000 records of 1 KiB, numbered by batch, and the offset after it.
With FLUSH_AFTER >= 0 the store is flushed after that many batches.
"""

import os
import sys
from pathlib import Path

from amps_on_kafka.log.codecs import JSON
from amps_on_kafka.state.record import NEVER, pack_record
from amps_on_kafka.state.store import PartitionStore

BATCH = 1000


def main() -> None:
    path, batches, flush_after, write_buffer = sys.argv[1:5]
    store = PartitionStore(Path(path), "t", 0, JSON, int(write_buffer))
    for number in range(int(batches)):
        staged = store.replacements()
        for i in range(BATCH):
            payload = b'{"pad":"' + b"x" * 1000 + b'"}'
            staged.put(f"{number}-{i}".encode(), pack_record(number, 0, NEVER, payload))
        store.write_replacements(staged, (number + 1) * BATCH)
        if number + 1 == int(flush_after):
            store.flush()
    os._exit(0)  # a crash: no close, no flush


if __name__ == "__main__":
    main()
