"""The collector pause is process-wide (the gc module has no other kind), so its cases
(collections_cases.py) run in an interpreter of their own: in this one, a worker thread
that another test left running would be inside a pause and decide their outcome."""

import subprocess
import sys
from pathlib import Path

CASES = Path(__file__).with_name("collections_cases.py")


def test_the_collector_pause_cases_pass_in_a_fresh_interpreter():
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist", CASES],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "5 passed" in result.stdout
