"""Two processes' agents on one PostgreSQL database: one learner at a time, in order.

Why two `Database` objects stand for two processes here: each has its own connection
pool and its own coordination connection, so PostgreSQL sees two separate sessions and
its advisory locks behave exactly as between processes (they are per session). The
tests with real bot processes are in tests/integration/test_multi_process.py; these
pin the engine's rules with the same scripted model as test_agent_learning.py.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

from sonality.agent import SonalityAgent
from sonality.evidence import MESSAGE
from sonality.llm import ToolResult
from sonality.store import Episode, Speaker, StateCommit
from storage import Database
from tests.engine.test_agent_learning import RecordingMemory, ScriptedLLM
from tests.pg import PostgresServer

COMMUNITY = "slack:TSHARED"


@pytest.fixture
def url(postgres_server: PostgresServer) -> str:
    return postgres_server.new_database()


@pytest.fixture
async def two(url: str) -> AsyncIterator[tuple[Database, Database]]:
    first = await Database.open_url(url)
    second = await Database.open_url(url)
    try:
        yield first, second
    finally:
        await first.close()
        await second.close()


async def load(db: Database, llm: ScriptedLLM) -> SonalityAgent:
    return await SonalityAgent.load(
        client=llm,
        store=db.community(COMMUNITY),
        episodes=RecordingMemory(),
        model="m",
        ess_model="m",
        label=COMMUNITY,
    )


async def settle(db: Database, *agents: SonalityAgent, wake: bool = False) -> None:
    """Until the outbox is empty: a worker that found the lease taken returns at once.
    `wake`: wake the agents each time round, as the host's periodic sweep does."""
    store = db.community(COMMUNITY)
    for _ in range(200):
        if wake:
            for agent in agents:
                await agent.wake_learning()
        await asyncio.gather(*(a.drain() for a in agents))
        if not await store.pending_count():
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"{await store.pending_count()} interaction(s) never learned")


async def learned_order(db: Database) -> list[str]:
    steps = await db.community(COMMUNITY).evidence()
    return [s.interaction_id or "" for s in steps if s.kind == MESSAGE]


async def interaction_ids(db: Database) -> list[str]:
    rows = await db._fetchall(
        "SELECT id FROM interactions WHERE community_id = ? ORDER BY seq", (COMMUNITY,)
    )
    return [r[0] for r in rows]


async def test_messages_answered_by_both_are_learned_once_in_the_order_answered(
    two: tuple[Database, Database],
) -> None:
    db_a, db_b = two
    llm_a, llm_b = ScriptedLLM(), ScriptedLLM()
    a, b = await load(db_a, llm_a), await load(db_b, llm_b)
    try:
        speaker = Speaker(id="U1", name="Ann")
        for i in range(12):  # alternating, as a load balancer spreads a workspace's events
            await (a if i % 2 == 0 else b).respond(f"message {i}", speaker)
        await settle(db_a, a, b)

        answered = await interaction_ids(db_a)
        assert len(answered) == 12
        assert await learned_order(db_a) == answered  # in order, no gap, none twice
        versions = sorted(
            await db_a.community(COMMUNITY).versions(limit=100), key=lambda v: v.version
        )
        assert [v.version for v in versions] == list(range(13))
        assert [v.interaction_count for v in versions[1:]] == list(range(1, 13))
        # Each message classified exactly once, by whichever process learned it.
        assert llm_a.purposes.count("ess") + llm_b.purposes.count("ess") == 12

        # The reply path of either process adopts the stored latest state first.
        await b.respond("one more", speaker)
        await a.respond("and another", speaker)
        assert a.sponge.version >= 12 and b.sponge.version >= 12
        await settle(db_a, a, b)
        assert len(await learned_order(db_a)) == 14
    finally:
        await a.close(grace_seconds=5)
        await b.close(grace_seconds=5)


async def test_rows_left_by_a_dead_learner_are_learned_once_by_the_other(
    url: str, two: tuple[Database, Database]
) -> None:
    db_a, db_b = two
    llm_a, llm_b = ScriptedLLM(), ScriptedLLM()
    a, b = await load(db_a, llm_a), await load(db_b, llm_b)
    dead = await Database.open_url(url)  # the process that will die holding the lease
    try:
        lease = dead.community(COMMUNITY).learning_lease()
        assert lease is not None and await lease.acquire()
        for i in range(3):
            await a.respond(f"while the learner hangs {i}", Speaker(id="U1", name="Ann"))
        await a.drain()
        await b.wake_learning()
        await b.drain()
        # Nobody else may learn while the holder lives.
        assert await db_a.community(COMMUNITY).pending_count() == 3
        assert llm_a.purposes.count("ess") + llm_b.purposes.count("ess") == 0

        # Its connection, and with it the lease, is gone once the server has seen it go;
        # meanwhile b is woken again and again, as the host's sweep does.
        await dead.close()
        await settle(db_b, b, wake=True)
        assert await learned_order(db_b) == await interaction_ids(db_b)
        assert llm_a.purposes.count("ess") + llm_b.purposes.count("ess") == 3
    finally:
        await dead.close()
        await a.close(grace_seconds=5)
        await b.close(grace_seconds=5)


async def test_a_rollback_in_one_process_waits_for_the_other_and_continues_its_versions(
    two: tuple[Database, Database],
) -> None:
    db_a, db_b = two
    a, b = await load(db_a, ScriptedLLM()), await load(db_b, ScriptedLLM())
    try:
        for i in range(4):
            await a.respond(f"message {i}", Speaker(id="U1", name="Ann"))
        await settle(db_a, a)
        restored = await b.rollback(2, actor="mod")  # b never learned: it catches up first
        assert restored.version == 5
        await a.respond("after the rollback", Speaker(id="U1", name="Ann"))
        assert a.sponge.version >= 5
        await settle(db_a, a, b)
        causes = [v.cause for v in await db_a.community(COMMUNITY).versions(limit=3)]
        assert causes == ["interaction", "rollback", "interaction"]
    finally:
        await a.close(grace_seconds=5)
        await b.close(grace_seconds=5)


async def test_the_next_learner_writes_memories_a_dead_process_committed_but_never_wrote(
    url: str, two: tuple[Database, Database]
) -> None:
    db_a, _ = two
    memory = RecordingMemory()
    a = await SonalityAgent.load(
        client=ScriptedLLM(), store=db_a.community(COMMUNITY), episodes=memory, label=COMMUNITY
    )
    dead = await Database.open_url(url)
    try:
        # What a process killed between its commit and its Chroma write leaves behind.
        state = a.sponge.model_copy(deep=True)
        state.version = 1
        lost = Episode(id="lost-1", user_message="m", summary="a memory never written")
        await dead.community(COMMUNITY).commit(
            StateCommit(state=state, cause="reflection", change="x", episodes=[lost])
        )
        await dead.close()
        await a.respond("hello", Speaker(id="U1", name="Ann"))
        await settle(db_a, a)
        assert "lost-1" in memory.by_id
        assert await db_a.community(COMMUNITY).pending_episodes() == []
        assert a.sponge.version == 2
    finally:
        await dead.close()
        await a.close(grace_seconds=5)


class SlowLLM(ScriptedLLM):
    """Classification takes a moment, so two learners are inside one message at once."""

    async def call_tool(self, **kwargs: Any) -> ToolResult:
        await asyncio.sleep(0.05)
        return await super().call_tool(**kwargs)


async def test_two_learners_at_once_still_learn_each_message_once_in_order(
    two: tuple[Database, Database], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Both believe they hold the lease (as after a coordination connection was lost
    unnoticed): the store's commit checks keep each message learned once, in order,
    and the learner that was overtaken neither parks nor counts a failed attempt."""
    db_a, db_b = two
    a, b = await load(db_a, SlowLLM()), await load(db_b, SlowLLM())
    for agent in (a, b):
        lease = agent.learning._lease
        assert lease is not None

        async def always() -> bool:
            return True

        monkeypatch.setattr(lease, "acquire", always)
    try:
        speaker = Speaker(id="U1", name="Ann")
        for i in range(10):
            await (a if i % 2 == 0 else b).respond(f"message {i}", speaker)
        await settle(db_a, a, b, wake=True)
        assert await learned_order(db_a) == await interaction_ids(db_a)
        # The overtaken learner stops too, instead of retrying a message already learned.
        for _ in range(100):
            if not (a.backlog or b.backlog):
                break
            await asyncio.sleep(0.05)
        assert (a.backlog, b.backlog, a.learning_held, b.learning_held) == (0, 0, False, False)
        rows = await db_a._fetchall(
            "SELECT status, attempts FROM interactions WHERE community_id = ?", (COMMUNITY,)
        )
        assert rows and all(r == ("done", 0) for r in rows), rows
    finally:
        await a.close(grace_seconds=5)
        await b.close(grace_seconds=5)


class HiddenSeen(RecordingMemory):
    """Notes the hidden ranges each recall was asked to leave out."""

    def __init__(self) -> None:
        super().__init__()
        self.hidden: list[list[Any]] = []

    def retrieve_typed(self, *args: Any, **kwargs: Any) -> list[str]:
        self.hidden.append(list(kwargs.get("hidden") or []))
        return []


async def test_a_reply_after_a_rollback_elsewhere_leaves_out_the_memories_it_hid(
    two: tuple[Database, Database],
) -> None:
    """The reply path's look at the stored latest state overlaps retrieval; a rollback
    it adopts still hides the undone memories from that very reply."""
    db_a, db_b = two
    memory = HiddenSeen()
    a = await SonalityAgent.load(
        client=ScriptedLLM(), store=db_a.community(COMMUNITY), episodes=memory, label=COMMUNITY
    )
    b = await load(db_b, ScriptedLLM())
    try:
        for i in range(4):
            await a.respond(f"message {i}", Speaker(id="U1", name="Ann"))
        await settle(db_a, a)
        assert a.sponge.hidden_ranges == []
        restored = await b.rollback(2, actor="mod")
        assert restored.hidden_ranges  # what was learned after v2 is out of reach
        await a.respond("after the rollback", Speaker(id="U1", name="Ann"))
        assert memory.hidden[-1] == restored.hidden_ranges
        await settle(db_a, a, b)
    finally:
        await a.close(grace_seconds=5)
        await b.close(grace_seconds=5)


async def test_the_reply_path_looks_for_a_newer_state_while_it_retrieves(
    two: tuple[Database, Database], monkeypatch: pytest.MonkeyPatch
) -> None:
    """One PostgreSQL read less in front of the model call: the version check and the
    memory retrieval are in flight together (each yields a few times and notes whether
    the other was running meanwhile)."""
    db_a, _ = two
    a = await load(db_a, ScriptedLLM())
    running: set[str] = set()
    overlapped: set[str] = set()

    def in_flight(name: str, call: Any) -> Any:
        async def wrapped(*args: Any, **kwargs: Any) -> Any:
            running.add(name)
            try:
                for _ in range(5):
                    if running - {name}:
                        overlapped.add(name)
                    await asyncio.sleep(0)
                return await call(*args, **kwargs)
            finally:
                running.discard(name)

        return wrapped

    try:
        await a.respond("hello", Speaker(id="U1", name="Ann"))
        await settle(db_a, a)
        monkeypatch.setattr(a.store, "latest_version", in_flight("version", a.store.latest_version))
        monkeypatch.setattr(a.memory, "recall", in_flight("recall", a.memory.recall))
        await a.respond("again", Speaker(id="U1", name="Ann"))
        assert overlapped == {"version", "recall"}
        await settle(db_a, a)
    finally:
        await a.close(grace_seconds=5)
