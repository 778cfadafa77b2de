"""The bot's write-behind memory on its own: what reaches the store, in what batches,
and what a forget-me removes. The store underneath is an in-process recorder (real
Chroma behind it is covered by tests/integration/test_pipeline.py and
test_forget_chroma.py); the point here is the bookkeeping between commit and write.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from chroma_memory.write_behind import EPISODE_BATCH, WriteBehindMemory
from sonality.memory.access import AgentMemory
from sonality.store import Episode
from tests.engine.test_agent_learning import RecordingMemory


def episodes(count: int, start: int = 0) -> list[Episode]:
    return [
        Episode(
            id=f"e{n}", user_message="", summary=f"memory {n}", interaction=n, embedding=(1.0, 0.0)
        )
        for n in range(start, start + count)
    ]


@pytest.fixture
async def memory() -> AsyncIterator[WriteBehindMemory]:
    made = WriteBehindMemory(RecordingMemory(), label="test")
    yield made
    await made.close(grace_seconds=5)


def test_the_agent_takes_it_as_its_own_memory_not_as_a_plain_store(
    memory: WriteBehindMemory,
) -> None:
    assert isinstance(memory, AgentMemory)


async def test_episodes_are_written_in_batches_and_reported_in_order(
    memory: WriteBehindMemory,
) -> None:
    written: list[list[str]] = []

    async def note(ids: list[str]) -> None:
        written.append(ids)

    await memory.start(episodes(EPISODE_BATCH + 3), note)
    await memory.flush()
    inner = memory.episodes
    assert isinstance(inner, RecordingMemory)
    assert [len(batch) for batch in written] == [EPISODE_BATCH, 3]
    assert [i for batch in written for i in batch] == [e.id for e in inner.stored]
    assert memory.unwritten == []


async def test_forget_drops_waiting_episodes_and_deletes_stored_ones(
    memory: WriteBehindMemory,
) -> None:
    async def ignore(ids: list[str]) -> None:
        return None

    await memory.start(episodes(2), ignore)
    await memory.flush()  # e0, e1 stored
    await memory.write(episodes(2, start=2))  # e2, e3 waiting
    await memory.forget({"e1", "e2"})
    await memory.flush()
    inner = memory.episodes
    assert isinstance(inner, RecordingMemory)
    assert sorted(inner.by_id) == ["e0", "e3"]
    assert "e2" not in [e.id for e in inner.stored]  # never written, not written later
