"""On SQLite the learning lease is held in memory, and learning takes the outbox path.

Why these exist: one learning path for every store (issue #23). On a store only this
process writes, the lease is a `LocalLease`; it must still be a lease (one holder at a
time, let go whatever happens to the holder), learning must read the store's outbox (a
row nobody queued is learned too), and it must stay cheap: one outbox read per message
learned alone, and no version check.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from sonality.agent import RollbackError, SonalityAgent
from sonality.evidence import MESSAGE
from sonality.llm import LLMError, ToolResult
from sonality.store import InteractionRecord, LocalLease, Speaker
from storage import Database
from tests.engine.test_agent_learning import RecordingMemory, ScriptedLLM
from tests.integration.conftest import eventually

COMMUNITY = "test:lease"
ANN = Speaker(id="U1", name="Ann")


@pytest.fixture
async def db(tmp_path: Path) -> AsyncIterator[Database]:
    async with await Database.open(tmp_path / "bot.sqlite3") as database:
        yield database


async def load(db: Database, llm: ScriptedLLM | None = None) -> SonalityAgent:
    return await SonalityAgent.load(
        client=llm or ScriptedLLM(),
        store=db.community(COMMUNITY),
        episodes=RecordingMemory(),
        model="m",
        ess_model="m",
        label=COMMUNITY,
    )


async def learned_ids(db: Database) -> list[str]:
    return [
        s.interaction_id or ""
        for s in await db.community(COMMUNITY).evidence()
        if s.kind == MESSAGE
    ]


async def test_the_sqlite_lease_has_one_holder_at_a_time(db: Database) -> None:
    mine = db.community(COMMUNITY).learning_lease()
    theirs = db.community(COMMUNITY).learning_lease()  # another store of the community
    elsewhere = db.community("test:other").learning_lease()
    assert isinstance(mine, LocalLease) and not mine.shared

    assert await mine.acquire()
    assert not await theirs.acquire()
    assert await elsewhere.acquire()  # a lease per community
    assert await mine.acquire()  # its holder again (learner and a moderator's change)
    await mine.release()
    assert not await theirs.acquire(), "held until the holder's last release"
    await mine.release()
    assert await theirs.acquire()
    assert not await mine.acquire()
    await theirs.release()
    await theirs.release()  # one release too many changes nothing
    assert await mine.acquire()
    await mine.release()
    async with db.job_run("nightly") as runs:  # one process: every job run is its own
        assert runs


async def test_the_lease_is_let_go_when_what_held_it_fails(
    db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    agent = await load(db)
    other = db.community(COMMUNITY).learning_lease()
    try:
        with pytest.raises(RollbackError):
            await agent.rollback(99, actor="mod")  # raises while holding the lease
        assert await other.acquire()
        await other.release()

        store = agent.store
        real = store.pending_interactions

        async def unreachable() -> list[InteractionRecord]:
            raise OSError("disk gone")

        monkeypatch.setattr(store, "pending_interactions", unreachable)
        await agent.respond("hello", ANN)
        await agent.drain()  # the round failed (logged) and let go
        assert await other.acquire()
        await other.release()

        monkeypatch.setattr(store, "pending_interactions", real)
        await agent.wake_learning()
        await agent.drain()
        assert agent.sponge.interaction_count == 1
    finally:
        await agent.close(grace_seconds=5)


async def test_a_row_recorded_behind_the_queues_back_is_learned_on_the_next_wake_up(
    db: Database,
) -> None:
    """As a crash leaves it: the row is in the outbox, no wake-up was ever queued for it."""
    agent = await load(db)
    try:
        orphan = InteractionRecord(id="left-by-a-crash", speaker=ANN, message="m0", reply="r0")
        assert await db.community(COMMUNITY).record_interaction(orphan)
        await agent.drain()
        assert agent.sponge.interaction_count == 0 and agent.backlog == 0

        await agent.respond("the next message", ANN)
        await agent.drain()
        learned = await learned_ids(db)
        assert learned[0] == "left-by-a-crash" and len(learned) == 2  # in the order recorded
        assert await db.community(COMMUNITY).pending_interactions() == []
    finally:
        await agent.close(grace_seconds=5)


async def test_learning_waits_while_another_holder_has_the_lease(db: Database) -> None:
    agent = await load(db)
    other = db.community(COMMUNITY).learning_lease()
    try:
        assert await other.acquire()
        await agent.respond("hello", ANN)
        await agent.drain()
        assert agent.sponge.interaction_count == 0
        assert len(await db.community(COMMUNITY).pending_interactions()) == 1
        await other.release()
        await agent.wake_learning()
        await agent.drain()
        assert agent.sponge.interaction_count == 1
    finally:
        await agent.close(grace_seconds=5)


class DownLLM(ScriptedLLM):
    """Classification fails as an outage does until `up` is set."""

    def __init__(self) -> None:
        super().__init__()
        self.up = False

    async def call_tool(self, **kwargs: Any) -> ToolResult:
        if not self.up:
            raise LLMError("model down", retry_after=60)
        return await super().call_tool(**kwargs)


async def test_a_moderator_change_goes_through_while_learning_waits_for_the_model(
    db: Database,
) -> None:
    """The learner keeps the lease while it waits for the model; the same agent's
    rollback still runs at once (its lease counts the holder twice), and the message is
    learned after it, on the rolled-back state."""
    llm = DownLLM()
    agent = await load(db, llm)
    try:
        await agent.respond("hello", ANN)
        assert await eventually(lambda: agent.learning_held, 5.0)
        assert agent.backlog == 1
        restored = await asyncio.wait_for(agent.rollback(0, actor="mod"), 5)
        assert restored.version == 1
        llm.up = True
        agent.resume_learning()
        assert await eventually(
            lambda: agent.backlog == 0 and agent.sponge.interaction_count == 1, 5.0
        )
        assert agent.sponge.version == 2
    finally:
        await agent.close(grace_seconds=5)


async def test_a_message_learned_alone_costs_one_outbox_read_and_no_version_check(
    db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What the one path must not add on SQLite (figure 3 is CPU per message)."""
    agent = await load(db)
    calls: dict[str, int] = {"pending_interactions": 0, "latest_version": 0}

    def counted(name: str) -> Any:
        call = getattr(agent.store, name)

        async def wrapped(*args: Any, **kwargs: Any) -> Any:
            calls[name] += 1
            return await call(*args, **kwargs)

        return wrapped

    try:
        for name in calls:
            monkeypatch.setattr(agent.store, name, counted(name))
        for i in range(3):
            await agent.respond(f"message {i}", ANN)
            await agent.drain()
        assert agent.sponge.interaction_count == 3
        assert calls == {"pending_interactions": 3, "latest_version": 0}
    finally:
        await agent.close(grace_seconds=5)
