#!/usr/bin/env bash
# Set up a fresh clone, idempotently: .venv with the project installed (editable, with the
# test extras) and Apache Kafka's jars in the cache, so `amps-kafka broker start` and the
# test suite can run a real broker. Re-running is cheap: pip runs only when pyproject.toml
# changed, and the jars are fetched only once.
set -euo pipefail
cd "$(dirname "$0")/.."

# Java runs the broker and Maven fetches its jars; install them where we can (Debian, root).
if ! command -v java >/dev/null || ! command -v mvn >/dev/null; then
  if command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
    echo "installing Java and Maven (apt-get) ..." >&2
    apt-get update -qq && apt-get install -y -qq default-jre-headless maven >/dev/null
  else
    echo "warning: java and mvn are needed for the local Kafka broker (Java 17+, Maven 3.6+)" >&2
  fi
fi

# kcat is the foreign producer of tests/robustness/test_foreign_producers.py (defect 14).
if ! command -v kcat >/dev/null; then
  if command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
    echo "installing kcat (apt-get) ..." >&2
    apt-get update -qq && apt-get install -y -qq kcat >/dev/null
  else
    echo "warning: kcat is needed by the foreign-producer tests (apt-get install kcat)" >&2
  fi
fi

# chromium (headless) opens the admin port's status page in tests/admin (issue 16).
if ! command -v chromium >/dev/null; then
  if command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
    echo "installing chromium (apt-get) ..." >&2
    apt-get update -qq && apt-get install -y -qq chromium >/dev/null
  else
    echo "warning: chromium is needed by the status-page test (apt-get install chromium)" >&2
  fi
fi

if [ ! -x .venv/bin/python ]; then
  echo "creating .venv ..." >&2
  "${PYTHON:-python3}" -m venv .venv
fi

stamp=.venv/.amps-install-stamp
want=$(.venv/bin/python -c 'import hashlib; print(hashlib.sha256(open("pyproject.toml", "rb").read()).hexdigest())')
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  echo "installing amps_on_kafka and its test dependencies into .venv ..." >&2
  .venv/bin/python -m pip install -q --disable-pip-version-check -e '.[test]'
  echo "$want" > "$stamp"
fi

.venv/bin/python -m amps_on_kafka.broker fetch >/dev/null
