"""Run benchmarks: `python -m bench [NAME ...]` (default: all), each printing ratios."""

from __future__ import annotations

import importlib
import sys

BENCHMARKS = [
    "log",
    "filters",
    "sow",
    "gateway",
    "queues",
    "stores",
    "spark",
    "robustness",
    "fairness",
    "admin",
    "scaling",
    "security",
]


def main() -> None:
    names = sys.argv[1:2] or BENCHMARKS
    rest = sys.argv[2:]
    for name in names:
        if name not in BENCHMARKS:
            raise SystemExit(f"unknown benchmark {name!r}; choose from {', '.join(BENCHMARKS)}")
        print(f"\n### bench {name}", flush=True)
        importlib.import_module(f"bench.{name}").main(rest)


if __name__ == "__main__":
    main()
