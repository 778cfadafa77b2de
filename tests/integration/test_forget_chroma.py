"""Forget-me deletes the member's memories from Chroma: the episodes of their
interactions (ids = interaction ids), whether already written or still waiting in the
agent's write-behind queue, while every other member's episodes stay.

The harness of test_forget_core.py (real agent, real SQLite, scripted LLM), with the
bot's Chroma store (`chroma_memory.community_store.CommunityEpisodeStore`) and the real
embedding model of the memory tests instead of the recording memory.

Checked through the Chroma client (ids and documents) and in the bytes of every file
under the Chroma directory: Chroma's own log table and SQLite free pages kept a deleted
document's text until `CommunityEpisodeStore.delete` learned to purge and vacuum them.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from bot.forget_me import forget_member
from chroma_memory import write_behind
from chroma_memory.community_store import CommunityEpisodeStore
from chroma_memory.embedding import FastMiniLML6V2
from chroma_memory.server import ServerMemory
from chroma_memory.write_behind import WriteBehindMemory
from sonality.agent import SonalityAgent
from sonality.memory.episodes import SEMANTIC, Episode, EpisodeStore
from storage import Database
from tests.chroma_server import ChromaServer, chroma_server  # noqa: F401 (fixture)
from tests.engine import test_replay as harness
from tests.engine.test_replay import ALICE, BOB, ScriptedLLM, script
from tests.integration.forget_scenario import files_holding
from tests.integration.test_forget_core import TOKEN, run, with_token
from tests.memory import conftest as memory

# Fixtures used here by name.
db = harness.db
model_cache_dir = memory.model_cache_dir
embedding_function = memory.embedding_function
persist_dir = memory.persist_dir

COMMUNITY = "test:whole"


@pytest.fixture
async def chroma_agent(
    db: Database, persist_dir: Path, embedding_function: FastMiniLML6V2
) -> AsyncIterator[tuple[SonalityAgent, ScriptedLLM, CommunityEpisodeStore]]:
    llm = ScriptedLLM()
    episodes = CommunityEpisodeStore.for_community(
        COMMUNITY, persist_dir, embedding_function=embedding_function
    )
    agent = await SonalityAgent.load(
        client=llm,
        store=db.community(COMMUNITY),
        episodes=WriteBehindMemory(episodes, config=harness.TUNABLES),  # as the bot does
        model="m",
        ess_model="m",
        config=harness.TUNABLES,
    )
    try:
        yield agent, llm, episodes
    finally:
        await agent.close(grace_seconds=5)


def documents(episodes: CommunityEpisodeStore) -> list[str]:
    with episodes.chroma.use():
        got = episodes._episodic().get(include=["documents"])
    return [d or "" for d in got.get("documents") or []]


async def test_forget_me_deletes_the_members_episodes_from_chroma(
    chroma_agent: tuple[SonalityAgent, ScriptedLLM, CommunityEpisodeStore],
    db: Database,
    persist_dir: Path,
) -> None:
    agent, llm, episodes = chroma_agent
    await run(agent, llm, with_token(script(4, 40)))
    await agent.flush_episodes()
    alice_ids = await db.member_interaction_ids(COMMUNITY, ALICE.id)
    bob_ids = await db.member_interaction_ids(COMMUNITY, BOB.id)
    assert alice_ids and bob_ids
    assert len(episodes.stored(alice_ids)) == len(alice_ids)  # written before the forget
    assert any(TOKEN in d for d in documents(episodes))
    assert files_holding([persist_dir], [TOKEN])  # the scan below can fail
    # One of Alice's episodes still waiting for the write-behind writer (as after a
    # restart, when the outbox's unwritten episodes are queued) must not land afterwards.
    episodes.delete(alice_ids[:1])
    memory = agent.memory
    assert isinstance(memory, WriteBehindMemory)
    memory.unwritten.append(
        Episode(
            id=alice_ids[0],
            user_message=f"{TOKEN} waiting",
            agent_response="",
            ess_score=0.5,
            topics=(),
            summary=f"Alice argues {TOKEN} for it.",
            interaction=1,
        )
    )

    await forget_member(db, agent, COMMUNITY, ALICE.id, requested_by="self")
    await agent.flush_episodes()

    assert episodes.stored(alice_ids) == []
    assert not any(TOKEN in d for d in documents(episodes))
    assert files_holding([persist_dir], [TOKEN]) == []
    assert all(e.id not in set(alice_ids) for e in memory.unwritten)
    # Every other member's episode is still there.
    assert sorted(s["id"] for s in episodes.stored(bob_ids)) == sorted(bob_ids)
    # Deleting again (a forget-me resumed after a crash) is a no-op.
    episodes.delete(alice_ids)
    assert sorted(s["id"] for s in episodes.stored(bob_ids)) == sorted(bob_ids)


async def reflected(agent: SonalityAgent, llm: ScriptedLLM) -> None:
    """Members' messages, each with an insight (Alice's quote the token), consolidated
    by a reflection into semantic memories."""
    for n, (speaker, answer) in enumerate(with_token(script(4, 12))):
        if answer is None:
            continue
        llm.ess.append(answer)
        who = "Alice" if speaker is ALICE else "Someone else"
        llm.insight = f"{who} made me weigh evidence ({TOKEN if speaker is ALICE else n})."
        await agent.respond(f"message {n}", speaker=speaker)
        await agent.drain()
    await agent.reflect_now("moderator", actor="mod")


def semantic_documents(episodes: CommunityEpisodeStore) -> list[str]:
    with episodes.chroma.use():
        semantic = episodes._semantic(create=False)
        if semantic is None:
            return []
        got = semantic.get(include=["documents"])
    return [d or "" for d in got.get("documents") or []]


async def test_forget_me_deletes_the_insights_a_reflection_drew_from_the_member(
    chroma_agent: tuple[SonalityAgent, ScriptedLLM, CommunityEpisodeStore],
    db: Database,
    persist_dir: Path,
) -> None:
    agent, llm, episodes = chroma_agent
    await reflected(agent, llm)
    await agent.flush_episodes()
    before = semantic_documents(episodes)
    assert any(TOKEN in d for d in before) and any(TOKEN not in d for d in before)

    await forget_member(db, agent, COMMUNITY, ALICE.id, requested_by="self")

    after = semantic_documents(episodes)
    assert after == [d for d in before if TOKEN not in d]  # the others' insights stay
    assert files_holding([persist_dir], [TOKEN]) == []


async def test_forget_me_deletes_the_members_insights_from_the_seeds_store(
    db: Database, tmp_path: Path, embedding_function: FastMiniLML6V2
) -> None:
    """The agent given the seed's plain store (written at each commit, one collection):
    the forget-me finds the member's insights through the memory interface too. It used
    to look for a method only the bot's stores had, and left them here."""
    episodes = EpisodeStore(tmp_path / "seed", embedding_function=embedding_function)
    llm = ScriptedLLM()
    agent = await SonalityAgent.load(
        client=llm,
        store=db.community(COMMUNITY),
        episodes=episodes,
        model="m",
        ess_model="m",
        config=harness.TUNABLES,
    )
    try:
        await reflected(agent, llm)
        assert await db.community(COMMUNITY).pending_episodes() == []  # all in Chroma
        before = seed_insights(episodes)
        assert any(TOKEN in d for d in before) and any(TOKEN not in d for d in before)

        await forget_member(db, agent, COMMUNITY, ALICE.id, requested_by="self")

        assert seed_insights(episodes) == [d for d in before if TOKEN not in d]
    finally:
        await agent.close(grace_seconds=5)


def seed_insights(episodes: EpisodeStore) -> list[str]:
    got = episodes._collection.get(where={"memory_type": SEMANTIC}, include=["documents"])
    return sorted(d or "" for d in got.get("documents") or [])


async def test_forget_me_drops_the_members_insights_still_waiting_to_be_written(
    db: Database,
    persist_dir: Path,
    embedding_function: FastMiniLML6V2,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The reflection's insights wait in the write-behind queue (and the outbox) when
    the forget-me comes: Alice's must never be written, the others' must."""
    monkeypatch.setattr(write_behind, "EPISODE_FLUSH_AT", 10_000)  # only flush() writes
    episodes = CommunityEpisodeStore.for_community(
        COMMUNITY, persist_dir, embedding_function=embedding_function
    )
    llm = ScriptedLLM()
    agent = await SonalityAgent.load(
        client=llm,
        store=db.community(COMMUNITY),
        episodes=WriteBehindMemory(episodes, flush_delay=3600, config=harness.TUNABLES),
        model="m",
        ess_model="m",
        config=harness.TUNABLES,
    )
    try:
        await reflected(agent, llm)
        waiting = [e.summary for e in await db.community(COMMUNITY).pending_episodes()]
        assert any(TOKEN in w for w in waiting) and semantic_documents(episodes) == []

        await forget_member(db, agent, COMMUNITY, ALICE.id, requested_by="self")
        await agent.flush_episodes()

        after = semantic_documents(episodes)
        assert after and not any(TOKEN in d for d in after)
        assert files_holding([persist_dir], [TOKEN]) == []
    finally:
        await agent.close(grace_seconds=5)


async def test_forget_me_deletes_the_members_insights_from_a_chroma_server(
    db: Database,
    chroma_server: ChromaServer,  # noqa: F811
    embedding_function: FastMiniLML6V2,
) -> None:
    memory = ServerMemory(chroma_server.url, database=chroma_server.fresh_database())
    llm = ScriptedLLM()
    store = memory.store_for(COMMUNITY, embedding_function)
    agent = await SonalityAgent.load(
        client=llm,
        store=db.community(COMMUNITY),
        episodes=WriteBehindMemory(store, config=harness.TUNABLES),
        model="m",
        ess_model="m",
        config=harness.TUNABLES,
    )
    try:
        await reflected(agent, llm)
        await agent.flush_episodes()
        before = semantic_documents(store._opened())
        assert any(TOKEN in d for d in before) and any(TOKEN not in d for d in before)

        await forget_member(db, agent, COMMUNITY, ALICE.id, requested_by="self")

        after = semantic_documents(store._opened())
        assert after == [d for d in before if TOKEN not in d]
    finally:
        await agent.close(grace_seconds=5)
        memory.close()
