"""A worker in its own process, so a test can SIGKILL it: prints a line per batch applied.

python -m tests.sow.worker_process CONFIG BOOTSTRAP STATE_DIR GROUP
"""

import sys

from amps_on_kafka.config import load_config
from amps_on_kafka.processor.worker import Worker


def main() -> None:
    config_path, bootstrap, state_dir, group = sys.argv[1:5]
    worker = Worker(load_config(config_path), bootstrap, state_dir, group_id=group)
    worker.engine.add_listener(lambda applied: print(f"applied {worker.applied}", flush=True))
    worker.run()


if __name__ == "__main__":
    main()
