"""Every Python and shell example in README.md and docs/*.md runs against the test broker.

One test per page (tests/docs/test_examples.py, and test_spark_examples.py for the pages
that require pyspark, so that a parallel run gives the slow Spark page a process of its
own); a page's runnable blocks (```python, ```sh, ```bash) run in the page's order and share
its state: the Python blocks one namespace, every block one temporary working directory
(with the files of `config/` linked into it, so the paths the docs use work). The docs are
written for a local broker at 127.0.0.1:39092 and a gateway at 127.0.0.1:9007; each block's
text has those rewritten to the test broker and to the gateway of the page's own worker
(started on a free port: `--listen 127.0.0.1:0`, its address read from its ready file), and
the environment carries them too (KAFKA_BOOTSTRAP_SERVERS, AMPS_KAFKA_SERVER), with the
venv's bin first on PATH. Each `amps-kafka worker` is given a consumer group of the page's
own, so that workers of other runs on a shared broker don't take its partitions.

What a page can say to the collector, on the line right before a block:

- `<!-- example: no-run (reason) -->`: the block is not run (a cluster that isn't there,
  a command that would disturb the machine's own broker...). ```text, ```console and
  ```yaml blocks are never run.
- `<!-- example: background (reason) -->`: a shell block that runs until the page ends
  (a worker, `replay --follow`). It is started and the page goes on; an `amps-kafka
  worker` in it is given `--ready-file` and the next block waits until it is ready. At
  the page's end it is stopped (SIGTERM); it must not have failed before.
- `<!-- example: in-process (reason) -->`: a shell block of `amps-kafka` commands only,
  run in the test's process (click's runner), so that they share one Spark session: on
  a page that requires pyspark, one local session is started for the whole page (a JVM
  for each command would take minutes).
- `<!-- example: config (reason) -->`: a ```yaml block that is a whole configuration; it
  is loaded as `amps-kafka worker --config` would load it (paths relative to `config/`).

And anywhere on a page, `<!-- example: requires MODULE -->`: skip the page when MODULE
does not import (pyspark: the Spark extra).
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
RUNNABLE = {"python", "sh", "bash"}
BLOCK_DIRECTIVES = {"no-run", "background", "config", "in-process"}
DOC_BROKER = "127.0.0.1:39092"
DOC_GATEWAY = "127.0.0.1:9007"
FENCE = re.compile(r"^(?P<indent>\s*)```(?P<lang>[\w-]*)\s*$")
DIRECTIVE = re.compile(r"<!--\s*example:\s*(?P<kind>[\w-]+)\s*(?P<rest>.*?)\s*-->")
BLOCK_TIMEOUT = 120.0  # seconds: a shell block that takes longer is a hang, not an example
READY_TIMEOUT = 60.0
NO_GATEWAY = "127.0.0.1:1"  # refuses connections: a page that uses 9007 without a worker
# The machine's own broker may be the one the tests use: an example must not stop it.
DISTURBS_THE_BROKER = re.compile(r"amps-kafka\s+broker\s+(start|stop)")


@dataclass(frozen=True)
class Block:
    line: int  # of the opening fence, 1-based
    lang: str
    text: str
    directive: str | None  # no-run, background, config, or None


def parse(text: str) -> tuple[list[Block], list[str]]:
    """A page's fenced blocks, each with the directive on the line before it (if any), and
    the modules its `requires` directives name."""
    lines = text.splitlines()
    blocks: list[Block] = []
    requires = [m["rest"] for m in DIRECTIVE.finditer(text) if m["kind"] == "requires"]
    index = 0
    while index < len(lines):
        opening = FENCE.match(lines[index])
        if opening is None:
            index += 1
            continue
        end = next(
            (i for i in range(index + 1, len(lines)) if lines[i].strip() == "```"), len(lines)
        )
        indent = len(opening["indent"])
        body = "\n".join(line[indent:] for line in lines[index + 1 : end]) + "\n"
        before = DIRECTIVE.search(lines[index - 1]) if index else None
        directive = before["kind"] if before and before["kind"] in BLOCK_DIRECTIVES else None
        blocks.append(Block(index + 1, opening["lang"].lower(), body, directive))
        index = end + 1
    return blocks, requires


class Page:
    """One page's run: its directory, environment, Python namespace and background jobs."""

    def __init__(self, path: Path, workdir: Path, bootstrap: str) -> None:
        self.path = path
        self.workdir = workdir
        self.gateway = NO_GATEWAY  # until the page starts a worker
        self.group = f"docs-{path.stem}-{uuid.uuid4().hex[:8]}"
        self.bootstrap = bootstrap
        (workdir / "config").mkdir()  # the repo's config/, entry by entry: writable, apart
        for entry in (ROOT / "config").iterdir():
            (workdir / "config" / entry.name).symlink_to(entry)
        bin_dir = str(Path(sys.executable).parent)
        self.env = {
            **os.environ,
            "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
            "KAFKA_BOOTSTRAP_SERVERS": bootstrap,
            "AMPS_KAFKA_SERVER": f"tcp://{self.gateway}/amps/json",
        }
        self.namespace: dict[str, object] = {"__name__": "__doc_example__"}
        self.background: list[tuple[Block, subprocess.Popen[str]]] = []

    def where(self, block: Block) -> str:
        return f"{self.path.relative_to(ROOT)}:{block.line}"

    def localise(self, text: str) -> str:
        text = text.replace(DOC_BROKER, self.bootstrap).replace(DOC_GATEWAY, self.gateway)
        if "--group" not in text:
            text = text.replace("amps-kafka worker ", f"amps-kafka worker --group {self.group} ")
        return text

    def run(self, block: Block) -> None:
        if block.lang != "python" and DISTURBS_THE_BROKER.search(block.text):
            pytest.fail(f"{self.where(block)}: starts or stops a broker: mark it no-run")
        if block.directive == "config":
            self.load_config(block)
        elif block.directive == "background":
            self.start(block)
        elif block.directive == "in-process":
            self.run_in_process(block)
        elif block.lang == "python":
            self.run_python(block)
        else:
            self.run_shell(block)

    def load_config(self, block: Block) -> None:
        from amps_on_kafka.config import load_config

        path = self.workdir / "config" / f".example-{self.path.stem}-{block.line}.yaml"
        path.write_text(block.text)
        load_config(path)

    def run_in_process(self, block: Block) -> None:
        from click.testing import CliRunner

        from amps_on_kafka.cli import main

        joined = self.localise(block.text).replace("\\\n", " ")
        for line in joined.splitlines():
            args = shlex.split(line, comments=True)
            if not args:
                continue
            if args[0] != "amps-kafka":
                pytest.fail(f"{self.where(block)}: in-process runs amps-kafka only: {line}")
            result = CliRunner().invoke(main, self.outputs_here(args[1:]), catch_exceptions=False)
            if result.exit_code != 0:
                pytest.fail(
                    f"{self.where(block)}: exit {result.exit_code}\n{line}\n{result.output}"
                )

    def outputs_here(self, args: list[str]) -> list[str]:
        """A relative --out made absolute in the page's directory: a shared Spark session's
        JVM resolves it against the directory the session started in (the checkout, when
        tests/spark started it first), not the page's."""
        return [
            str(self.workdir / arg) if before == "--out" and "://" not in arg else arg
            for before, arg in zip(["", *args[:-1]], args, strict=True)
        ]

    def run_python(self, block: Block) -> None:
        code = compile(self.localise(block.text), self.where(block), "exec")
        exec(code, self.namespace)  # the example's own code, as a reader would run it

    def run_shell(self, block: Block) -> None:
        try:
            done = subprocess.run(
                ["bash", "-euo", "pipefail", "-c", self.localise(block.text)],
                cwd=self.workdir,
                env=self.env,
                capture_output=True,
                text=True,
                timeout=BLOCK_TIMEOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,  # its background jobs are killed with it on timeout
            )
        except subprocess.TimeoutExpired as exc:
            pytest.fail(f"{self.where(block)}: still running after {BLOCK_TIMEOUT:.0f} s\n{exc}")
        if done.returncode != 0:
            pytest.fail(
                f"{self.where(block)}: exit {done.returncode}\n{block.text}\n"
                f"--- stdout\n{done.stdout}\n--- stderr\n{done.stderr}"
            )

    def start(self, block: Block) -> None:
        """Start a background block; wait for the worker it starts (if any) to be ready."""
        ready = self.workdir / f".example-ready-{block.line}.json"
        text = self.localise(block.text.replace(DOC_GATEWAY, "127.0.0.1:0"))
        starts_worker = "amps-kafka worker" in text and "--ready-file" not in text
        if starts_worker:
            text = text.replace("amps-kafka worker", f"amps-kafka worker --ready-file {ready}")
        log = open(self.workdir / f".example-{block.line}.log", "w+")  # noqa: SIM115
        process = subprocess.Popen(
            ["bash", "-euo", "pipefail", "-c", text],
            cwd=self.workdir,
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            text=True,
            start_new_session=True,
        )
        self.background.append((block, process))
        deadline = time.monotonic() + READY_TIMEOUT
        while starts_worker and not ready.exists():
            if process.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"{self.where(block)}: no worker ready\n{self.output(block)}")
            time.sleep(0.1)  # polling for the ready file, with the deadline above
        if starts_worker:
            gateway = json.loads(ready.read_text())["gateway"]
            self.gateway = gateway.removeprefix("tcp://").removesuffix("/amps/json")
            self.env["AMPS_KAFKA_SERVER"] = os.environ["AMPS_KAFKA_SERVER"] = gateway

    def output(self, block: Block) -> str:
        return (self.workdir / f".example-{block.line}.log").read_text()

    def stop(self) -> list[str]:
        """Stop the background blocks; the complaints about those that failed."""
        complaints = []
        for block, process in self.background:
            failed = process.poll() not in (None, 0)
            if failed:
                complaints.append(f"{self.where(block)}: exit {process.returncode}")
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
            if failed:
                complaints.append(self.output(block))
        self.background.clear()
        return complaints


def run_page(path: Path, page_runner: Callable[[Path], Page]) -> None:
    """Run a page's runnable blocks in order; fail on the first that fails, or on a
    background block that had died by the end."""
    blocks, requires = parse(path.read_text())
    for module in requires:
        if importlib.util.find_spec(module) is None:
            pytest.skip(f"needs {module} (not installed)")
    runnable = runnable_blocks(blocks)
    page = page_runner(path)
    with contextlib.ExitStack() as spark:
        if "pyspark" in requires:
            from amps_on_kafka.spark.session import spark_session

            session = spark.enter_context(
                spark_session("local[2]", shuffle_partitions=2, progress=False)
            )
            spark.callback(work_in, session, work_in(session, page.workdir))
        for block in runnable:
            started = time.monotonic()
            page.run(block)
            print(f"{page.where(block)}: {time.monotonic() - started:.1f} s")  # with -s or -rP
    complaints = page.stop()
    assert not complaints, "\n".join(complaints)


def runnable_blocks(blocks: list[Block]) -> list[Block]:
    return [
        b
        for b in blocks
        if (b.lang in RUNNABLE and b.directive != "no-run") or b.directive == "config"
    ]


def pages_with_examples(*, spark: bool) -> list[Path]:
    """The pages with a runnable block: those that say `requires pyspark`, or the others."""
    pages = []
    for page in PAGES:
        blocks, requires = parse(page.read_text())
        if runnable_blocks(blocks) and ("pyspark" in requires) == spark:
            pages.append(page)
    return pages


def work_in(session: SparkSession, directory: Path | str) -> str:
    """Relative paths in a page's Spark code resolve in `directory`, as a reader's would
    in theirs; returns the directory they resolved in before. The JVM resolves them
    against its local file system's working directory, which is where it started: the
    checkout, when an earlier test of this process started it."""
    hadoop = session._jvm.org.apache.hadoop.fs
    local = hadoop.FileSystem.getLocal(session._jsc.hadoopConfiguration())
    before = local.getWorkingDirectory().toString()
    local.setWorkingDirectory(hadoop.Path(str(directory)))
    return before
