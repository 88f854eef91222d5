#!/usr/bin/env bash
# A guided tour against a real broker: $KAFKA_BOOTSTRAP_SERVERS if set, else the local one
# (started here and left running; `.venv/bin/amps-kafka broker stop` stops it).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh  # the project alone: the tour needs no test or Spark packages
if [ -z "${KAFKA_BOOTSTRAP_SERVERS:-}" ]; then
  .venv/bin/amps-kafka broker start
fi
.venv/bin/python -m amps_on_kafka.tour "$@"
