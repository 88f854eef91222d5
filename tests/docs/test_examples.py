"""The examples of README.md and docs/*.md run (tests/docs/pages.py says how); the pages
that require pyspark are in test_spark_examples.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.docs.pages import ROOT, pages_with_examples, parse, run_page

OTHER_PAGES = pages_with_examples(spark=False)


def test_parse_reads_fences_directives_and_requirements():
    page = (
        "<!-- example: requires json -->\n```sh\necho 1\n```\n"
        "<!-- example: no-run (a cluster) -->\n```python\nx = 1\n```\n"
        "- item\n  ```bash\n  echo 2\n  ```\n```text\nnot run\n```\n"
    )
    blocks, requires = parse(page)
    assert requires == ["json"]
    assert [(b.line, b.lang, b.text, b.directive) for b in blocks] == [
        (2, "sh", "echo 1\n", None),
        (6, "python", "x = 1\n", "no-run"),
        (10, "bash", "echo 2\n", None),
        (13, "text", "not run\n", None),
    ]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("path", OTHER_PAGES, ids=[str(p.relative_to(ROOT)) for p in OTHER_PAGES])
def test_the_examples_of_a_page_run(path: Path, page_runner) -> None:
    run_page(path, page_runner)
