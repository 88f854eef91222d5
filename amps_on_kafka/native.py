"""The compiled core (`native/`, Rust), when it is installed, else None.

Each compiled function has a Python twin that gives the same results; callers take the
compiled one when this module found it and the twin otherwise, so a machine without Rust
still runs every path, only slower. `AMPS_NATIVE=0` in the environment makes the process
use the twins (to compare the two, or to rule the compiled core out of a problem).
"""

from __future__ import annotations

import os
from types import ModuleType


def _load() -> ModuleType | None:
    if os.environ.get("AMPS_NATIVE", "1") == "0":
        return None
    try:
        import amps_on_kafka_native
    except ImportError:
        return None
    return amps_on_kafka_native


core: ModuleType | None = _load()
