"""Replies outrank memory writes, and the gate works in every event loop it is used in."""

from __future__ import annotations

import asyncio
import time

from sonality.priority import ReplyPriority


async def _contended_wait(gate: ReplyPriority) -> float:
    """Time a writer waits while a reply holds the gate for 50 ms."""

    async def reply() -> None:
        with gate.replying():
            await asyncio.sleep(0.05)

    task = asyncio.create_task(reply())
    await asyncio.sleep(0)  # let the reply enter the gate
    start = time.perf_counter()
    await gate.wait_quiet()
    waited = time.perf_counter() - start
    await task
    return waited


def test_writer_waits_for_the_reply_then_proceeds() -> None:
    waited = asyncio.run(_contended_wait(ReplyPriority(max_wait=1.0)))
    assert 0.03 <= waited < 0.5


def test_the_wait_is_bounded() -> None:
    waited = asyncio.run(_contended_wait(ReplyPriority(max_wait=0.01)))
    assert waited < 0.04


def test_one_gate_used_from_two_event_loops() -> None:
    """A runtime is re-created in a new loop (tests, benchmarks): the gate must not break."""
    gate = ReplyPriority(max_wait=1.0)
    for _ in range(2):
        waited = asyncio.run(_contended_wait(gate))
        assert waited >= 0.03


def test_uncontended_wait_returns_at_once() -> None:
    gate = ReplyPriority()
    start = time.perf_counter()
    asyncio.run(gate.wait_quiet())
    assert time.perf_counter() - start < 0.01
