"""A worker in its own process, so a test can SIGKILL it: prints a line per batch applied.

python -m tests.sow.worker_process CONFIG BOOTSTRAP STATE_DIR GROUP (tests: `spawn`)
"""

import subprocess
import sys
from pathlib import Path

from amps_on_kafka.config import load_config
from amps_on_kafka.processor.worker import Worker

ROOT = Path(__file__).parents[2]  # where `-m tests.sow.worker_process` is found


def spawn(
    config_file: Path, bootstrap: str, state_dir: Path, group: str, stdout: int = subprocess.PIPE
) -> subprocess.Popen[str]:
    """This module's worker, in a process of its own, its lines on `stdout` (a pipe)."""
    command = [sys.executable, "-m", "tests.sow.worker_process", str(config_file), bootstrap]
    return subprocess.Popen([*command, str(state_dir), group], cwd=ROOT, stdout=stdout, text=True)


def main() -> None:
    config_path, bootstrap, state_dir, group = sys.argv[1:5]
    worker = Worker(load_config(config_path), bootstrap, state_dir, group_id=group)
    worker.engine.add_listener(lambda applied: print(f"applied {worker.applied}", flush=True))
    worker.run()


if __name__ == "__main__":
    main()
