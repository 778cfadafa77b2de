"""The engine's own memory path (`DirectMemory`, used when the host hands the agent a
plain `EpisodeMemory`): episodes reach the store right after their commit, and a write
that fails is not lost but made on the next start from the store's episode outbox.

Same stand-ins as test_agent_learning: a scripted `LLMClient`, the real SQLite store
and an in-process memory that records what it is given.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence
from typing import Any

import pytest

from sonality.agent import SonalityAgent
from sonality.config import MIN_EPISODE_RELEVANCE, EngineConfig
from sonality.memory.access import AgentMemory, DirectMemory
from sonality.memory.episodes import EpisodeMemory
from sonality.store import Episode
from storage import Database
from tests.engine import test_agent_learning as harness
from tests.engine.test_agent_learning import COMMUNITY, RecordingMemory, ScriptedLLM

# Fixtures used here by name.
db = harness.db


class FailingOnceMemory(RecordingMemory):
    """Refuses the first write, as a full disk or a broken index would."""

    def __init__(self) -> None:
        super().__init__()
        self.refused = 0

    def store_many(self, episodes: Sequence[Episode]) -> None:
        if self.refused == 0:
            self.refused += 1
            raise OSError("disk full")
        super().store_many(episodes)


class BudgetMemory(RecordingMemory):
    """Records the budget each recall asks for."""

    def __init__(self) -> None:
        super().__init__()
        self.asked: list[tuple[Any, ...]] = []

    def retrieve_typed(self, *args: Any, **kwargs: Any) -> list[str]:
        self.asked.append(args[1:])  # after the query: episodic, semantic, relevance
        return []


class SlowDeleteMemory(RecordingMemory):
    """Holds its first delete until `release` is set, and refuses the deletes listed in
    `refuse` (by their order), recording the ids of each delete it is asked for."""

    def __init__(self, refuse: Sequence[int] = ()) -> None:
        super().__init__()
        self.started = threading.Event()
        self.release = threading.Event()
        self.deletes: list[list[str]] = []
        self.refuse = set(refuse)

    def delete(self, ids: Sequence[str]) -> None:
        self.deletes.append(list(ids))
        self.started.set()
        assert self.release.wait(10), "the test never released the first delete"
        if len(self.deletes) - 1 in self.refuse:
            raise OSError("the index could not be saved")
        super().delete(ids)


async def load(
    db: Database,
    memory: EpisodeMemory | AgentMemory,
    config: EngineConfig | None = None,
    community: str = COMMUNITY,
) -> SonalityAgent:
    return await SonalityAgent.load(
        client=ScriptedLLM(),
        store=db.community(community),
        episodes=memory,
        model="m",
        config=config or EngineConfig(),
    )


async def test_a_plain_store_gets_each_episode_right_after_its_commit(db: Database) -> None:
    memory = RecordingMemory()
    agent = await load(db, memory)
    assert isinstance(agent.memory, DirectMemory) and agent.episodes is memory
    try:
        await agent.respond("hello")
        await agent.learning.settled()  # no flush: nothing is left waiting
        assert [e.interaction for e in memory.writes] == [1]
        assert await db.community(COMMUNITY).pending_episodes() == []
    finally:
        await agent.close(grace_seconds=5)


async def test_a_failed_write_is_made_on_the_next_start(
    db: Database, caplog: pytest.LogCaptureFixture
) -> None:
    memory = FailingOnceMemory()
    agent = await load(db, memory)
    try:
        await agent.respond("hello")
        await agent.drain()
    finally:
        await agent.close(grace_seconds=5)
    assert "writing memories failed" in caplog.text
    assert agent.sponge.interaction_count == 1  # the learning itself was committed
    [waiting] = await db.community(COMMUNITY).pending_episodes()
    assert memory.writes == []

    again = await load(db, memory)
    try:
        assert [e.id for e in memory.writes] == [waiting.id]
        assert await db.community(COMMUNITY).pending_episodes() == []
    finally:
        await again.close(grace_seconds=5)


async def test_a_host_memory_is_used_as_given(db: Database) -> None:
    given = DirectMemory(RecordingMemory(), "host")
    agent = await load(db, given)
    try:
        assert isinstance(given, AgentMemory) and agent.memory is given
    finally:
        await agent.close(grace_seconds=5)


async def test_a_plain_store_is_asked_for_the_agents_own_recall_budget(db: Database) -> None:
    """Two agents in one process, each with its budget: each recall asks for its own."""
    small, large = BudgetMemory(), BudgetMemory()
    a = await load(db, small, EngineConfig(episodic_retrieval_count=1, semantic_retrieval_count=0))
    b = await load(
        db, large, EngineConfig(episodic_retrieval_count=7, semantic_retrieval_count=4), "test:b"
    )
    try:
        await a.respond("hello")
        await b.respond("hello")
    finally:
        await a.close(grace_seconds=5)
        await b.close(grace_seconds=5)
    assert small.asked == [(1, 0, MIN_EPISODE_RELEVANCE)]
    assert large.asked == [(7, 4, MIN_EPISODE_RELEVANCE)]


async def _forget_while_the_first_delete_runs(
    agent: SonalityAgent, memory: SlowDeleteMemory
) -> list[BaseException | None]:
    """One forget starts and its delete is held; five more arrive; then all go on."""
    first = asyncio.create_task(agent.forget_episodes(None, ["m0"]))
    assert await asyncio.to_thread(memory.started.wait, 10)
    rest = [asyncio.create_task(agent.forget_episodes(None, [f"m{i}"])) for i in range(1, 6)]
    for _ in range(100):  # each runs up to the lock the first delete holds, in one step
        if len(agent._unforgotten_ids) == 5:
            break
        await asyncio.sleep(0)
    assert len(agent._unforgotten_ids) == 5, "the five forgets did not all wait"
    memory.release.set()
    return await asyncio.gather(first, *rest, return_exceptions=True)


async def test_forgets_that_wait_for_a_delete_are_deleted_together(db: Database) -> None:
    """A purge ends dozens of deletions at once, and each delete may save the index and
    rebuild Chroma's file: the ids that arrive while one runs go in one delete."""
    memory = SlowDeleteMemory()
    memory.by_id.update((f"m{i}", Episode(id=f"m{i}", user_message="x")) for i in range(6))
    agent = await load(db, memory)
    try:
        assert await _forget_while_the_first_delete_runs(agent, memory) == [None] * 6
    finally:
        await agent.close(grace_seconds=5)
    assert memory.deletes == [["m0"], ["m1", "m2", "m3", "m4", "m5"]]
    assert memory.by_id == {}


async def test_a_failed_joint_delete_is_tried_again_by_those_still_waiting(
    db: Database,
) -> None:
    """The caller whose delete failed is told; the ids of the callers that had joined
    it are not dropped on the floor: the next of them deletes them again, so no caller
    returns as if its memories were gone while they are still stored."""
    memory = SlowDeleteMemory(refuse=[1])
    memory.by_id.update((f"m{i}", Episode(id=f"m{i}", user_message="x")) for i in range(6))
    agent = await load(db, memory)
    try:
        outcomes = await _forget_while_the_first_delete_runs(agent, memory)
    finally:
        await agent.close(grace_seconds=5)
    failed = [o for o in outcomes if o is not None]
    assert len(failed) == 1 and isinstance(failed[0], OSError)
    joined = ["m1", "m2", "m3", "m4", "m5"]
    assert memory.deletes == [["m0"], joined, joined]  # refused once, then deleted
    assert memory.by_id == {}
