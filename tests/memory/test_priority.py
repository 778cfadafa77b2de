"""Replies outrank memory writes, and the gate works in every event loop it is used in.

Everything here is about order (who is still waiting when something else happens),
driven by events the test controls; nothing measures how long a wait took.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

import pytest

from chroma_memory.priority import ReplyPriority

# Long enough never to elapse in a test that expects the reply to release the writer:
# if it did elapse, the ordering assertions below would fail, not pass by accident.
NEVER = 3600.0
# A bound on how long a broken gate may hang a test before it fails instead.
HANG_GUARD = 30.0
T = TypeVar("T")


def run(scenario: Coroutine[Any, Any, T]) -> T:
    """Run a scenario in a fresh event loop; a gate that never opens fails the test."""
    return asyncio.run(asyncio.wait_for(scenario, HANG_GUARD))


async def yield_to_loop(times: int = 20) -> None:
    """Let every ready task run a few steps."""
    for _ in range(times):
        await asyncio.sleep(0)


async def reply_holding(gate: ReplyPriority, release: asyncio.Event, log: list[str]) -> None:
    with gate.replying():
        log.append("reply entered")
        await release.wait()
        log.append("reply leaving")
    log.append("reply left")


async def writer(gate: ReplyPriority, log: list[str]) -> None:
    await gate.wait_quiet()
    log.append("writer proceeds")


async def writer_waits_for_the_reply(gate: ReplyPriority) -> list[str]:
    log: list[str] = []
    release = asyncio.Event()
    reply = asyncio.create_task(reply_holding(gate, release, log))
    await yield_to_loop()
    assert log == ["reply entered"]
    write = asyncio.create_task(writer(gate, log))
    await yield_to_loop()
    assert not write.done(), "the writer went ahead while a reply was retrieving"
    release.set()
    await asyncio.gather(reply, write)
    return log


def test_writer_waits_for_the_reply_then_proceeds() -> None:
    log = run(writer_waits_for_the_reply(ReplyPriority(max_wait=NEVER)))
    assert log == ["reply entered", "reply leaving", "reply left", "writer proceeds"]


def test_the_writer_waits_for_the_last_of_several_replies() -> None:
    async def scenario() -> list[str]:
        gate = ReplyPriority(max_wait=NEVER)
        log: list[str] = []
        first, second = asyncio.Event(), asyncio.Event()
        replies = [
            asyncio.create_task(reply_holding(gate, first, [])),
            asyncio.create_task(reply_holding(gate, second, [])),
        ]
        await yield_to_loop()
        write = asyncio.create_task(writer(gate, log))
        first.set()
        await yield_to_loop()
        assert not write.done(), "one reply still retrieving, yet the writer went ahead"
        log.append("second reply released")
        second.set()
        await asyncio.gather(*replies, write)
        return log

    assert run(scenario()) == ["second reply released", "writer proceeds"]


def test_a_reply_that_fails_still_releases_the_writer() -> None:
    async def scenario() -> list[str]:
        gate = ReplyPriority(max_wait=NEVER)
        log: list[str] = []
        fail = asyncio.Event()

        async def failing_reply() -> None:
            with gate.replying():
                await fail.wait()
                raise RuntimeError("retrieval failed")

        reply = asyncio.create_task(failing_reply())
        await yield_to_loop()
        write = asyncio.create_task(writer(gate, log))
        await yield_to_loop()
        assert not write.done()
        fail.set()
        with pytest.raises(RuntimeError):
            await reply
        await write
        return log

    assert run(scenario()) == ["writer proceeds"]


def test_the_wait_is_bounded() -> None:
    """A reply that never ends cannot starve the writer: it proceeds while the reply
    is still inside the gate."""

    async def scenario() -> list[str]:
        gate = ReplyPriority(max_wait=0.01)
        log: list[str] = []
        release = asyncio.Event()
        reply = asyncio.create_task(reply_holding(gate, release, log))
        await yield_to_loop()
        await writer(gate, log)
        release.set()
        await reply
        return log

    assert run(scenario()) == [
        "reply entered",
        "writer proceeds",
        "reply leaving",
        "reply left",
    ]


def test_one_gate_used_from_two_event_loops() -> None:
    """A runtime is re-created in a new loop (tests, benchmarks): the gate must not break."""
    gate = ReplyPriority(max_wait=NEVER)
    for _ in range(2):
        log = run(writer_waits_for_the_reply(gate))
        assert log[-1] == "writer proceeds" and log.index("reply left") < log.index(
            "writer proceeds"
        )


def test_uncontended_wait_returns_at_once() -> None:
    """With no reply retrieving, the writer does not even yield to the loop: a callback
    scheduled before the wait has not run when the wait returns."""

    async def scenario() -> list[str]:
        gate = ReplyPriority(max_wait=NEVER)
        ran: list[str] = []
        asyncio.get_running_loop().call_soon(ran.append, "other work")
        await gate.wait_quiet()
        return list(ran)

    assert run(scenario()) == []
