"""Forget-me after retention: the member's old messages are gone from the database (the
audit retention deletes them), but the memories they made are still in Chroma, and the
evidence log still names them. Forget-me must find those memories by the evidence log
and delete them, or replies keep recalling the member's arguments."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any

from storage import RetentionPolicy
from tests.fakes.anthropic_server import AnthropicFake
from tests.integration.conftest import ALICE, BOB, A, command, say
from tests.integration.test_forget_inflight import teach


async def stored(agent: Any, *ids: str) -> set[str]:
    """Which of `ids` Chroma holds."""
    return {str(e["id"]) for e in await asyncio.to_thread(agent.episodes.stored, list(ids))}


async def test_forget_me_deletes_the_memories_of_messages_retention_deleted(
    runtime: Any, anthropic_server: AnthropicFake
) -> None:
    teach(anthropic_server)
    await say(runtime, "The lanternquince survey favours rent control (argfor).")
    await say(runtime, "A vacancy study says otherwise (argvs).", user=BOB)
    [alice] = await runtime.db.member_interaction_ids(A.id, ALICE.id)
    [bob] = await runtime.db.member_interaction_ids(A.id, BOB.id)
    agent = runtime.registry.get(A.id)
    assert agent is not None
    await agent.flush_episodes()
    assert await stored(agent, alice, bob) == {alice, bob}

    await runtime.db.apply_retention(datetime.now(UTC) + timedelta(days=400), RetentionPolicy())
    assert await runtime.db.member_interaction_ids(A.id, ALICE.id) == []
    assert await runtime.db.member_episode_ids(A.id, ALICE.id) == [alice]

    done = await command(runtime, "forget-me", "confirm", moderator=False)
    assert done.ok and "Forgotten" in done.text
    assert await stored(agent, alice, bob) == {bob}
    assert await runtime.db.member_episode_ids(A.id, ALICE.id) == []
