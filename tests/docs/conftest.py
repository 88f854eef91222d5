"""The page runner fixture of the docs-examples tests (tests/docs/pages.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.docs.pages import Page


@pytest.fixture
def page_runner(bootstrap, tmp_path, monkeypatch) -> Iterator[type[Page]]:
    """Makes a Page in a temporary working directory; its background blocks are stopped
    when the test ends, whatever happened."""
    pages: list[Page] = []

    def make(path: Path) -> Page:
        page = Page(path, tmp_path, bootstrap)
        for name in ("KAFKA_BOOTSTRAP_SERVERS", "AMPS_KAFKA_SERVER", "PATH"):
            monkeypatch.setenv(name, page.env[name])  # for the Python blocks, in process
        monkeypatch.chdir(tmp_path)
        pages.append(page)
        return page

    yield make  # type: ignore[misc]
    for page in pages:
        page.stop()
