"""The examples of README.md and docs/*.md run (tests/docs/pages.py says how); the pages
that require pyspark are in test_spark_examples.py."""

from __future__ import annotations

import ast
import builtins
from pathlib import Path

import pytest

from tests.docs.pages import PAGES, ROOT, pages_with_examples, parse, run_page, runnable_blocks

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


def names_missing(code: str) -> set[str]:
    """The names a block reads that it neither imports, defines nor gets from builtins."""
    tree = ast.parse(code)
    bound = set(dir(builtins))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import | ast.ImportFrom):
            bound |= {(alias.asname or alias.name).split(".")[0] for alias in node.names}
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            bound.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            bound.add(node.id)
        elif isinstance(node, ast.arg):
            bound.add(node.arg)
        elif isinstance(node, ast.ExceptHandler) and node.name:
            bound.add(node.name)
    read = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
    return read - bound


def test_names_missing_finds_what_a_block_does_not_import():
    assert names_missing("from a import B\nwith B() as c:\n    C(c)\n") == {"C"}


@pytest.mark.parametrize("path", PAGES, ids=[str(p.relative_to(ROOT)) for p in PAGES])
def test_each_python_example_imports_what_it_uses(path: Path) -> None:
    """A reader copies one block: the page's shared namespace must not hide an import
    that only an earlier block made (the README's replay and sow snippets lacked Client)."""
    blocks, _ = parse(path.read_text())
    for block in runnable_blocks(blocks):
        if block.lang == "python":
            missing = names_missing(block.text)
            assert not missing, f"{path.name}:{block.line} uses {sorted(missing)} unimported"
