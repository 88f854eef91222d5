"""The differential tests compare the compiled core with its Python twins, so they need
the core: without it (AMPS_NATIVE=0 asks for the twins alone) they are skipped, and
test_core.py fails unless AMPS_NATIVE=0 was asked for, so a core that did not build can't
pass for one that was turned off."""

from __future__ import annotations

import pytest

from amps_on_kafka.native import core


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    if core is not None:
        return
    skip = pytest.mark.skip(reason="the compiled core is not loaded")
    for item in items:
        if item.path.parent.name == "native" and item.path.name != "test_core.py":
            item.add_marker(skip)
