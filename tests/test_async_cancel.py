"""``rcoord.asyncio.cancel.cancel_and_wait``: tasks end even when a cancel is lost."""

from __future__ import annotations

import asyncio

import pytest

from rcoord.asyncio.cancel import cancel_and_wait


def test_a_task_that_loses_its_first_cancels_still_ends():
    # As a task on Python 3.11 whose asyncio.wait_for completed as the cancel came: it carries
    # on, and one cancel() then await would wait for it for ever.
    lost = []

    async def loses_cancels() -> str:
        for _ in range(3):
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                lost.append(1)
        await asyncio.sleep(3600)
        return "never"

    async def main() -> bool:
        task = asyncio.create_task(loses_cancels())
        await asyncio.sleep(0)  # (started: parked in its first sleep)
        await asyncio.wait_for(cancel_and_wait([task]), 10)
        return task.cancelled()

    assert asyncio.run(main())
    assert len(lost) == 3


def test_what_the_tasks_ended_with_is_retrieved_not_raised(caplog):
    # (not retrieved, asyncio logs "Task exception was never retrieved" when the task goes)
    import gc

    gc.collect()  # another test's tasks, left to the collector: not this test's to judge
    async def fails() -> None:
        try:
            await asyncio.sleep(3600)
        finally:
            raise RuntimeError("while ending")

    async def done_early() -> int:
        return 7

    async def main() -> list[bool]:
        failing = asyncio.create_task(fails())
        early = asyncio.create_task(done_early())
        await asyncio.sleep(0)
        await cancel_and_wait([failing, early])
        return [failing.done(), early.result() == 7]

    assert asyncio.run(main()) == [True, True]
    gc.collect()
    assert not [r for r in caplog.records
                if "never retrieved" in r.getMessage() and "while ending" in r.getMessage()]


@pytest.mark.parametrize("tasks", [[], ()])
def test_no_tasks_returns_at_once(tasks):
    asyncio.run(cancel_and_wait(tasks))
