#!/usr/bin/env bash
# Set up a fresh clone, idempotently: .venv with the project installed (editable, with the
# extras named by the argument: `bootstrap.sh test,spark` for the test suite, nothing for
# the tour) and Apache Kafka's jars in the cache, so `amps-kafka broker start` can run a
# real broker. Re-running is cheap: pip runs only when pyproject.toml or the extras
# changed, and the jars are fetched only once. It checks Python 3.11+ with venv and Java
# 17+, and says what to install when one is missing.
set -euo pipefail
cd "$(dirname "$0")/.."
extras=${1:-}

fail() { echo "error: $*" >&2; exit 1; }
can_install() { command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; }

python=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  command -v "$python" >/dev/null ||
    fail "no $python: install Python 3.11+ (Debian: apt-get install python3 python3-venv)"
  "$python" -c 'import sys; sys.exit(sys.version_info < (3, 11))' ||
    fail "$python is $("$python" -V 2>&1); Python 3.11+ is needed (set PYTHON=python3.12 ...)"
  "$python" -c 'import venv, ensurepip' 2>/dev/null ||
    fail "$python has no venv module: install it (Debian: apt-get install python3-venv)"
fi

# The major version of `java`, 0 when there is none (`1.8.0_x` is 8, `17.0.2` is 17).
java_major() {
  command -v java >/dev/null || { echo 0; return; }
  java -version 2>&1 | awk -F'"' '/version/ { split($2, v, "."); print (v[1] == 1 ? v[2] : v[1]) + 0; exit }'
}

# Java runs the broker and Maven fetches its jars; install them where we can (Debian, root).
if [ "$(java_major)" -lt 17 ] || ! command -v mvn >/dev/null; then
  if can_install; then
    echo "installing Java 17+ and Maven (apt-get) ..." >&2
    apt-get update -qq && apt-get install -y -qq default-jre-headless maven >/dev/null
  fi
fi
if [ "$(java_major)" -lt 17 ]; then
  found=$(command -v java >/dev/null && java -version 2>&1 | head -1 || echo "no java")
  why="Java 17+ runs the local Kafka broker and Spark; found: $found"
  how="install a JRE 17+ (Debian: apt-get install openjdk-17-jre-headless) and put it on PATH"
  if [ -n "${KAFKA_BOOTSTRAP_SERVERS:-}" ]; then
    echo "warning: $why (using \$KAFKA_BOOTSTRAP_SERVERS instead)" >&2
  else
    fail "$why: $how, or set KAFKA_BOOTSTRAP_SERVERS to a broker you run"
  fi
fi
command -v mvn >/dev/null ||
  echo "warning: mvn (Maven 3.6+) fetches the broker's jars (Debian: apt-get install maven)" >&2

case ",$extras," in *,test,*) tests=1 ;; *) tests=0 ;; esac

# kcat is the foreign producer of tests/robustness/test_foreign_producers.py (defect 14).
if [ "$tests" = 1 ] && ! command -v kcat >/dev/null; then
  if command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
    echo "installing kcat (apt-get) ..." >&2
    apt-get update -qq && apt-get install -y -qq kcat >/dev/null
  else
    echo "warning: kcat is needed by the foreign-producer tests (apt-get install kcat)" >&2
  fi
fi

# chromium (headless) opens the admin port's status page in tests/admin (issue 16).
if [ "$tests" = 1 ] && ! command -v chromium >/dev/null; then
  if command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
    echo "installing chromium (apt-get) ..." >&2
    apt-get update -qq && apt-get install -y -qq chromium >/dev/null
  else
    echo "warning: chromium is needed by the status-page test (apt-get install chromium)" >&2
  fi
fi

if [ ! -x .venv/bin/python ]; then
  echo "creating .venv ..." >&2
  "$python" -m venv .venv
fi

# The stamp is the hash of pyproject.toml and the extras: a change of either reinstalls
# (pip keeps what is already there, so switching between tour and tests is quick).
stamp=.venv/.amps-install-stamp
want="$(.venv/bin/python -c 'import hashlib; print(hashlib.sha256(open("pyproject.toml", "rb").read()).hexdigest())') [$extras]"
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  echo "installing amps_on_kafka${extras:+ with [$extras]} into .venv ..." >&2
  .venv/bin/python -m pip install -q --disable-pip-version-check -e ".${extras:+[$extras]}"
  echo "$want" > "$stamp"
fi

# The compiled core (native/, Rust through PyO3 and maturin; docs/architecture.md) is built
# with cargo. Rust comes from rustup (https://rustup.rs); without it, Debian's cargo is
# installed where we can. The build is redone only when native/'s sources change.
if ! command -v cargo >/dev/null && [ -x "$HOME/.cargo/bin/cargo" ]; then
  PATH="$HOME/.cargo/bin:$PATH"
fi
if ! command -v cargo >/dev/null && can_install; then
  echo "installing Rust's cargo (apt-get) ..." >&2
  apt-get update -qq && apt-get install -y -qq cargo >/dev/null
fi
command -v cargo >/dev/null ||
  fail "cargo builds the compiled core in native/: install Rust (https://rustup.rs, or Debian: apt-get install cargo)"
native_stamp=.venv/.amps-native-stamp
native_want="$(cat native/Cargo.toml native/pyproject.toml native/src/*.rs | sha256sum)"
if [ "$(cat "$native_stamp" 2>/dev/null)" != "$native_want" ]; then
  echo "building the compiled core (native/) into .venv ..." >&2
  .venv/bin/python -m pip install -q --disable-pip-version-check ./native ||
    fail "the compiled core in native/ did not build (cargo $(cargo --version 2>&1)); see the errors above"
  echo "$native_want" > "$native_stamp"
fi

.venv/bin/python -m amps_on_kafka.broker fetch >/dev/null
