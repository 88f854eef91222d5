"""The examples of the pages that require pyspark (docs/spark.md): a file of their own, so a
parallel run gives the slowest page a process of its own (tests/docs/pages.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.docs.pages import ROOT, pages_with_examples, run_page

SPARK_PAGES = pages_with_examples(spark=True)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("path", SPARK_PAGES, ids=[str(p.relative_to(ROOT)) for p in SPARK_PAGES])
def test_the_examples_of_a_spark_page_run(path: Path, page_runner) -> None:
    run_page(path, page_runner)
