#!/usr/bin/env bash
# Lint and test: `scripts/test.sh` runs everything; arguments go to pytest
# (e.g. `scripts/test.sh tests/broker -x`).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
.venv/bin/ruff check .
.venv/bin/python -m pytest -q "$@"
