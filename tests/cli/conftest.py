"""The `run` fixture of test_cli.py (the CLI against the session broker), for every CLI test."""

from tests.cli.test_cli import run

__all__ = ["run"]
