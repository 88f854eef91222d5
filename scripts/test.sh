#!/usr/bin/env bash
# Lint, type-check and test: `scripts/test.sh` runs everything; arguments go to pytest
# (e.g. `scripts/test.sh tests/broker -x`). Test files run in $AMPS_TEST_PROCESSES processes
# (default 3: most tests wait on Kafka, not the CPU) sharing one broker (tests/conftest.py).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh test,spark  # CI runs the Spark tests too
.venv/bin/ruff check .
.venv/bin/mypy  # strict, on the public client API (the files in pyproject's [tool.mypy])
.venv/bin/python -m pytest -q -n "${AMPS_TEST_PROCESSES:-3}" --dist loadfile "$@"
