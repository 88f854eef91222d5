"""The peer: a Quix Streams application keeping the latest value per key in RocksDB.

Run by bench/sow.py in its own virtualenv (Quix pins an older confluent-kafka):
    python bench/quix_peer.py BOOTSTRAP TOPIC COUNT STATE_DIR
Prints the rate (records/s) from the first record to the COUNT-th, as JSON.
"""

import json
import sys
import time

from quixstreams import Application


def main() -> None:
    bootstrap, topic_name, count, state_dir = (
        sys.argv[1],
        sys.argv[2],
        int(sys.argv[3]),
        sys.argv[4],
    )
    app = Application(
        broker_address=bootstrap,
        consumer_group=f"quix-peer-{time.time_ns()}",
        auto_offset_reset="earliest",
        state_dir=state_dir,
        use_changelog_topics=False,  # like the worker here: state in RocksDB, no changelog
        loglevel="WARNING",
    )
    marks: list[float] = []

    def keep_latest(value, state):
        if not marks:
            marks.append(time.perf_counter())
        state.set("latest", value)

    sdf = app.dataframe(app.topic(topic_name, value_deserializer="json"))
    sdf = sdf.update(keep_latest, stateful=True)
    app.run(sdf, count=count, collect=False)
    print(json.dumps({"seconds": time.perf_counter() - marks[0], "count": count}))


if __name__ == "__main__":
    main()
