"""The compiled core is what the tests run: bootstrap builds it into the environment, so a
run without it (a failed build, a stale environment) would test only the Python twins."""

from __future__ import annotations

import os

import pytest

from amps_on_kafka.native import core


@pytest.mark.skipif(os.environ.get("AMPS_NATIVE") == "0", reason="AMPS_NATIVE=0 asks for the twins")
def test_the_compiled_core_is_loaded():
    assert core is not None, "amps_on_kafka_native is not installed: run scripts/bootstrap.sh"
    assert core.ABI == 1
    assert hasattr(core, "BlindRecords")
