"""PublishBudget, the bound on the worker's publishes in flight (defect 5), as a state
machine: any order of reservations, releases and cancellations keeps it within its
limits, grants first come first served, and never leaves a waiter that would fit."""

from __future__ import annotations

import asyncio
import threading

from hypothesis import given, settings
from hypothesis import strategies as st

from amps_on_kafka.server import delivery
from amps_on_kafka.server.delivery import PublishBudget
from amps_on_kafka.server.requests import Request
from amps_on_kafka.server.writes import RECORD_OVERHEAD, charge

MAX_BYTES = 1000
MAX_COMMANDS = 4

steps = st.lists(
    st.one_of(
        st.tuples(st.just("reserve"), st.integers(1, 1500)),  # some larger than the budget
        st.tuples(st.just("release"), st.integers(0, 10)),
        st.tuples(st.just("cancel"), st.integers(0, 10)),
    ),
    max_size=60,
)


async def settle() -> None:
    for _ in range(3):
        await asyncio.sleep(0)


def check(budget: PublishBudget, waiting: list[tuple[int, asyncio.Task[None]]]) -> None:
    assert 0 <= budget.commands <= MAX_COMMANDS
    assert budget.bytes <= MAX_BYTES or budget.commands == 1  # one oversized goes alone
    if waiting:  # the head waits only because it does not fit
        size = waiting[0][0]
        assert budget.commands == MAX_COMMANDS or budget.bytes + size > MAX_BYTES


async def run(plan: list[tuple[str, int]]) -> None:
    budget = PublishBudget(MAX_BYTES, MAX_COMMANDS)
    waiting: list[tuple[int, asyncio.Task[None]]] = []
    held: list[int] = []
    for action, value in plan:
        if action == "reserve":
            waiting.append((value, asyncio.create_task(budget.reserve(value))))
        elif action == "release" and held:
            budget.release(held.pop(value % len(held)))
        elif action == "cancel" and waiting:
            _size, task = waiting.pop(value % len(waiting))
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        await settle()
        granted = [(size, task) for size, task in waiting if task.done()]
        assert granted == waiting[: len(granted)], "granted out of order"
        held += [size for size, _ in granted]
        waiting = waiting[len(granted) :]
        check(budget, waiting)
    while held:
        budget.release(held.pop())
        await settle()
        held += [size for size, task in waiting if task.done()]
        waiting = [(size, task) for size, task in waiting if not task.done()]
    assert not waiting and budget.commands == 0 and budget.bytes == 0


@settings(max_examples=300, deadline=None)
@given(steps)
def test_the_budget_bounds_grants_in_order_and_returns_to_zero(plan):
    asyncio.run(run(plan))


def test_memory_is_handed_back_when_the_budget_empties_after_holding_much(monkeypatch):
    """librdkafka's copies of publishes are freed into malloc arenas glibc keeps; once
    the budget empties after holding TRIM_AFTER_BYTES, they are returned (malloc_trim)."""
    trimmed = threading.Event()
    calls: list[int] = []

    def record() -> None:
        calls.append(1)
        trimmed.set()

    monkeypatch.setattr(delivery, "release_freed_memory", record)

    async def scenario() -> None:
        budget = PublishBudget(64 << 20, 100)
        small = 1024
        await budget.reserve(small)
        budget.release(small)  # held little: nothing to hand back
        big = delivery.TRIM_AFTER_BYTES
        await budget.reserve(big)
        await budget.reserve(small)
        budget.release(big)  # not empty yet
        assert not calls
        budget.release(small)
        await asyncio.get_running_loop().run_in_executor(None, trimmed.wait, 10)

    asyncio.run(scenario())
    assert calls == [1]


def test_memory_is_handed_back_after_many_small_publishes_too(monkeypatch):
    """librdkafka spends about a kilobyte per publish beside its payload: many small ones
    count (TRIM_AFTER_COMMANDS) as much as many bytes."""
    trimmed = threading.Event()
    monkeypatch.setattr(delivery, "release_freed_memory", trimmed.set)

    async def scenario() -> None:
        count = delivery.TRIM_AFTER_COMMANDS
        budget = PublishBudget(64 << 20, count)
        for _ in range(count):
            await budget.reserve(10)
        for _ in range(count):
            budget.release(10)
        await asyncio.get_running_loop().run_in_executor(None, trimmed.wait, 10)

    asyncio.run(scenario())
    assert trimmed.is_set()


def test_release_freed_memory_runs_where_the_libc_has_it_or_not():
    delivery.release_freed_memory()  # glibc: malloc_trim(0); elsewhere nothing


def test_a_commands_charge_counts_the_headers_its_records_carry() -> None:
    """librdkafka's queue limits count no header: a correlation id or SOW key is charged
    to the budget with the payload (a megabyte of correlation id was 256 bytes)."""
    plain = Request({"c": "publish", "t": "t"}, b'{"id": 1}', frozenset())
    assert charge(plain) == 9 + RECORD_OVERHEAD
    big = Request({"c": "publish", "t": "t", "x": "c" * 900_000}, b"", frozenset())
    assert charge(big) == 900_000 + RECORD_OVERHEAD
    keys = Request({"c": "sow_delete", "t": "t", "k": "a,bc", "x": 5}, b"", frozenset())
    assert charge(keys) == 2 * 3 + 2 * RECORD_OVERHEAD  # a record a key; x is refused later
    listed = Request({"c": "sow_delete", "t": "t", "k": ["a", "bc", 3]}, b"", frozenset())
    assert charge(listed) == charge(keys)
