"""Benchmark compiled filters against equivalent hand-written Python lambdas.

Usage: python -m bench filters [--records N] [--seed S] [--repeat R]

Both sides run over the same decoded dicts with ``sum(map(fn, records))`` so loop overhead is
identical; each rate is the best of R runs.  The ratio is filter rate / lambda rate (the
target is >= 0.5).  Exits 1 only if a filter and its lambda disagree on the match count,
which would be a bug.
"""

from __future__ import annotations

import argparse
import random
import re
import sys
import time
from collections.abc import Callable
from typing import Any

from amps_on_kafka.expr import compile_filter

SYMBOLS = [f"S{i:02d}" for i in range(40)] + ["IBM", "MSFT", "MSCI", "AAPL"]
REGIONS = ["EMEA", "APAC", "AMER"]
IN_LIST = [f"S{i:02d}" for i in range(0, 40, 2)]
_MS = re.compile("^MS").search
_IN_SET = frozenset(IN_LIST)

Case = tuple[str, str, Callable[[Any], bool]]

CASES: list[Case] = [
    (
        "equality AND range",
        "/sym = 'IBM' AND /qty > 100",
        lambda r: r.get("sym") == "IBM" and r.get("qty", 0) > 100,
    ),
    ("LIKE", "/sym LIKE '^MS'", lambda r: _MS(r.get("sym", "")) is not None),
    (
        "IN list of 20",
        "/sym IN (" + ", ".join(f"'{s}'" for s in IN_LIST) + ")",
        lambda r: r.get("sym") in _IN_SET,
    ),
    (
        "nested path",
        "/account/region = 'EMEA'",
        lambda r: r.get("account", {}).get("region") == "EMEA",
    ),
    ("arithmetic", "/price * /qty > 10000", lambda r: r.get("price", 0) * r.get("qty", 0) > 10000),
]


def make_records(count: int, seed: int) -> list[dict]:
    """Deterministic order-like records, shaped as a JSON decoder returns them."""
    rng = random.Random(seed)
    return [
        {
            "id": i,
            "sym": rng.choice(SYMBOLS),
            "qty": rng.randint(1, 1000),
            "price": round(rng.uniform(1.0, 500.0), 2),
            "side": rng.choice("BS"),
            "account": {"region": rng.choice(REGIONS), "id": rng.randint(1, 500)},
        }
        for i in range(count)
    ]


def best_rate(fn: Callable[[Any], bool], records: list[dict], repeat: int) -> tuple[float, int]:
    """Records per second (best of ``repeat``) and the number matched."""
    best, matched = float("inf"), 0
    for _ in range(repeat):
        start = time.perf_counter()
        matched = sum(map(fn, records))
        best = min(best, time.perf_counter() - start)
    return len(records) / best, matched


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args(argv)
    records = make_records(args.records, args.seed)
    print(f"{len(records)} records, seed {args.seed}, best of {args.repeat}\n")
    print(f"{'filter':<22}{'compiled/s':>14}{'lambda/s':>14}{'ratio':>8}{'matched':>10}")
    status = 0
    for name, text, handwritten in CASES:
        compiled_rate, compiled_hits = best_rate(compile_filter(text).matches, records, args.repeat)
        lambda_rate, lambda_hits = best_rate(handwritten, records, args.repeat)
        ratio = compiled_rate / lambda_rate
        print(
            f"{name:<22}{compiled_rate:>14,.0f}{lambda_rate:>14,.0f}{ratio:>8.2f}"
            f"{compiled_hits:>10}"
        )
        if compiled_hits != lambda_hits:
            print(f"  MISMATCH: {text!r} matched {compiled_hits}, lambda {lambda_hits}")
            status = 1
    return status


if __name__ == "__main__":
    sys.exit(main())
