"""The bot's write-behind memory on its own: what reaches the store, in what batches,
and what a forget-me removes. The store underneath is an in-process recorder (real
Chroma behind it is covered by tests/integration/test_pipeline.py and
test_forget_chroma.py); the point here is the bookkeeping between commit and write.
What Chroma itself refuses (an id twice in one write, a vector of the wrong size) is
tried on real Chroma, embedded and server.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from chroma_memory.community_store import CommunityEpisodeStore
from chroma_memory.embedding import FastMiniLML6V2
from chroma_memory.shared_chroma import ChromaHandle
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
    assert [i for batch in written for i in batch] == [e.id for e in inner.writes]
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
    assert "e2" not in [e.id for e in inner.writes]  # never written, not written later


def stored_documents(store: CommunityEpisodeStore) -> dict[str, str]:
    with store.chroma.use():
        got = store._episodic().get(include=["documents"])
    return dict(zip(got["ids"], [d or "" for d in got["documents"] or []], strict=True))


class Noted:
    """The `written` callback: the ids reported stored (their outbox rows go)."""

    def __init__(self) -> None:
        self.ids: list[str] = []

    async def __call__(self, ids: list[str]) -> None:
        self.ids += ids


def plain(n: int, summary: str | None = None) -> Episode:
    """An episode without a vector: the store embeds its summary."""
    return Episode(id=f"p{n}", user_message="", summary=summary or f"memory {n}", interaction=n)


async def test_an_episode_handed_in_twice_is_written_once_as_last_handed_in(
    persist_dir: Path, chroma: ChromaHandle, embedding_function: FastMiniLML6V2
) -> None:
    """Issue 22, finding 13: a process that adopts the other processes' waiting episodes
    (`SonalityAgent.catch_up`) handed in episodes it already held; Chroma refused the
    batch naming an id twice, and every later write with it."""
    store = CommunityEpisodeStore(persist_dir, client=chroma, embedding_function=embedding_function)
    memory = WriteBehindMemory(store, label="test", flush_delay=3600)
    noted = Noted()
    try:
        await memory.start([plain(1), plain(2)], noted)
        # p1 again as the outbox holds it (no reply text, no topics): stays where it was.
        queued = plain(1).model_copy(update={"agent_response": "a reply", "topics": ("x",)})
        memory.unwritten[0] = queued
        await memory.write([plain(1), plain(3)])
        assert memory.unwritten[0] is queued
        await memory.write([plain(2, "memory 2, revised")])  # last wins
        assert [e.id for e in memory.unwritten] == ["p1", "p3", "p2"]
        await memory.flush()
        assert stored_documents(store) == {
            "p1": "memory 1",
            "p2": "memory 2, revised",
            "p3": "memory 3",
        }
        assert sorted(noted.ids) == ["p1", "p2", "p3"] and memory.unwritten == []
    finally:
        await memory.close(grace_seconds=5)


async def test_a_batch_chroma_refuses_costs_only_the_refused_episode(
    persist_dir: Path,
    chroma: ChromaHandle,
    embedding_function: FastMiniLML6V2,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A batch refused for good (here an episode carrying a vector of another size, as
    from another embedding model) stayed at the head of the queue, so every later write
    failed too. Now the others of the batch are written, the refused one leaves the
    queue (never reported written: its outbox row stays), and the log says why."""
    store = CommunityEpisodeStore(persist_dir, client=chroma, embedding_function=embedding_function)
    store.store_many([plain(0)])  # the collection now holds vectors of the model's size
    memory = WriteBehindMemory(store, label="test", flush_delay=3600)
    noted = Noted()
    odd = Episode(id="odd", user_message="", summary="odd", interaction=9, embedding=(1.0, 0.0))
    try:
        await memory.start([plain(1), odd, plain(2)], noted)
        await memory.flush()
        assert sorted(stored_documents(store)) == ["p0", "p1", "p2"]
        assert sorted(noted.ids) == ["p1", "p2"] and memory.unwritten == []
        assert any("refused episode odd" in r.getMessage() for r in caplog.records)
        # Later writes are not held up by it.
        await memory.write([plain(3)])
        await memory.flush()
        assert "p3" in stored_documents(store) and noted.ids[-1] == "p3"
    finally:
        await memory.close(grace_seconds=5)


async def test_a_store_that_cannot_be_reached_keeps_the_batch_queued() -> None:
    """Only a refusal drops an episode from the queue: a connection error keeps the batch
    for the next try, and nothing is reported written."""

    class Unreachable(RecordingMemory):
        def store_many(self, episodes: Sequence[Episode]) -> None:
            raise ConnectionError("no route to the memory store")

    memory = WriteBehindMemory(Unreachable(), label="test", flush_delay=3600)
    noted = Noted()
    try:
        await memory.start(episodes(3), noted)
        with pytest.raises(ConnectionError):
            await memory.flush()
        assert [e.id for e in memory.unwritten] == ["e0", "e1", "e2"] and noted.ids == []
    finally:
        await memory.close(grace_seconds=5)  # tries once more, and logs that it failed


class Guard:
    """A `WriteGuard` whose outbox is a set: what another process has not written and
    no forget-me has discarded."""

    def __init__(self, outbox: set[str]) -> None:
        self.outbox = outbox

    async def acquire(self) -> bool:
        return True

    async def release(self) -> None:
        return None

    async def still_to_write(self, episode_ids: Sequence[str]) -> set[str]:
        return self.outbox & set(episode_ids)

    async def discard(self, episode_ids: Sequence[str]) -> None:
        self.outbox -= set(episode_ids)


class Recalling(RecordingMemory):
    """Records the waiting episodes each recall ranks."""

    def __init__(self) -> None:
        super().__init__()
        self.ranked: list[list[str]] = []

    def retrieve_typed(self, *args: Any, **kwargs: Any) -> list[str]:
        self.ranked.append([e.id for e in kwargs.get("unwritten", ())])
        return []


async def test_recall_leaves_out_waiting_episodes_another_process_forgot() -> None:
    """Issue 22 (noticed with finding 1): a forget-me handled by another process removes
    the member's episodes from the shared outbox, but this process's queue kept them
    and recalled them, ranked in memory, until its next batch (up to the flush delay)."""
    guard = Guard({"e0", "e1", "e2"})
    inner = Recalling()
    memory = WriteBehindMemory(inner, label="test", guard=guard, flush_delay=3600)
    try:
        await memory.start(episodes(3), Noted())
        await memory.recall("anything", ())
        guard.outbox -= {"e1"}  # the other process forgot e1's member
        await memory.recall("anything", ())
        assert inner.ranked == [["e0", "e1", "e2"], ["e0", "e2"]]
        assert [e.id for e in memory.unwritten] == ["e0", "e2"]
    finally:
        await memory.close(grace_seconds=5)
