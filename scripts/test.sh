#!/usr/bin/env bash
# Lint, type-check and test: `scripts/test.sh` runs everything; arguments go to pytest
# (e.g. `scripts/test.sh tests/broker -x`). Test files run in $AMPS_TEST_PROCESSES
# processes (default 2, one a core: three were faster but made rare load flakes in queue
# tests) sharing one broker (tests/conftest.py).
# Tests marked `timing` assert wall-clock speed, so a full run gives them the machine alone.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh test,spark  # CI runs the Spark tests too
.venv/bin/ruff check .
.venv/bin/mypy  # strict, on the public client API (the files in pyproject's [tool.mypy])
parallel=(-n "${AMPS_TEST_PROCESSES:-2}" --dist loadfile)
if [ $# -gt 0 ]; then
    .venv/bin/python -m pytest -q "${parallel[@]}" "$@"
else
    .venv/bin/python -m pytest -q "${parallel[@]}" -m "not timing"
    .venv/bin/python -m pytest -q -m timing
fi
