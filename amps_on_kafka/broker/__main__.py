"""``python -m amps_on_kafka.broker fetch``: fetch the broker's jars without the full CLI.

Set-up scripts call this before anything else; it depends on nothing but this sub-package,
so a half-written command elsewhere in the CLI can't break a fresh clone's set-up.
"""

from __future__ import annotations

import argparse
import sys

from amps_on_kafka.broker.errors import BrokerError
from amps_on_kafka.broker.jars import fetch_jars


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m amps_on_kafka.broker")
    parser.add_argument("command", choices=["fetch"], help="fetch Kafka's jars into the cache")
    parser.parse_args(argv)
    try:
        libs = fetch_jars(echo=lambda message: print(message, file=sys.stderr))
    except BrokerError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(libs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
