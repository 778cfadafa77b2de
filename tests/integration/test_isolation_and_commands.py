"""Communities never see each other; moderators inspect and roll back through commands."""

from __future__ import annotations

import asyncio
from typing import Any

from bot.runtime import Runtime
from sonality.state import SEED_SNAPSHOT
from tests.integration.conftest import ALICE, BOB, A, B, chat_requests, command, prompt_of, say
from tests.stack import on_every_stack

#: Every test here runs on the embedded default and on PostgreSQL + a Chroma server.
pytestmark = on_every_stack

CANARY: dict[str, Any] = dict(
    contains="road-safety audit",
    score=0.85,
    direction="supports",
    topics=["canary_zebra_crossings"],
    novelty=0.9,
    reasoning_type="empirical_data",
    source_reliability="peer_reviewed",
    summary="User shows a 2019 road-safety audit proving raised zebra crossings cut injuries.",
)
CANARY_TEXT = "A 2019 road-safety audit found that raised zebra crossings cut injuries by 40%."


async def teach_canary(runtime: Runtime) -> None:
    await say(runtime, CANARY_TEXT, community=A)
    for i in range(3):
        await say(runtime, f"filler {i}", community=A)
    agent = runtime.registry.get(A.id)
    assert agent is not None
    assert "canary_zebra_crossings" in agent.sponge.opinion_vectors


async def test_two_communities_never_share_beliefs_episodes_or_buffers(runtime, llm_server):
    llm_server.brain.ess_rule(**CANARY)
    await teach_canary(runtime)
    await say(runtime, "Tell me about zebra crossings and road safety.", community=B)

    b_reply = chat_requests(llm_server)[-1]
    assert "canary_zebra" not in prompt_of(b_reply)
    assert "road-safety audit" not in prompt_of(b_reply)
    assert len(b_reply.messages) == 1  # Alice's buffer in A did not follow her to B
    # Same question in A does retrieve A's memory (so the check above can fail).
    await say(runtime, "Tell me about zebra crossings and road safety.", community=A)
    a_reply = chat_requests(llm_server)[-1]
    assert "road-safety audit" in prompt_of(a_reply)

    beliefs_b = await command(runtime, "beliefs", community=B)
    assert "canary" not in beliefs_b.text
    beliefs_a = await command(runtime, "beliefs", community=A)
    assert "canary_zebra_crossings" in beliefs_a.text
    agent_b = runtime.registry.get(B.id)
    found = await asyncio.to_thread(agent_b.episodes.retrieve, "zebra crossings road safety")
    assert not any("audit" in s for s in found)
    assert "canary_zebra_crossings" not in agent_b.sponge.opinion_vectors
    # Each community is recorded under its own display name (written after the reply).
    for community in (A, B):
        info = await runtime.db.community_info(community.id)
        assert info is not None and info.name == community.name


async def test_read_only_commands(runtime, llm_server):
    llm_server.brain.ess_rule(**CANARY)
    await teach_canary(runtime)

    beliefs = await command(runtime, "beliefs", moderator=False)
    assert beliefs.ok
    assert "canary_zebra_crossings: +0.04" in beliefs.text
    assert "evidence 1" in beliefs.text and "road-safety audit" in beliefs.text
    topic = await command(runtime, "beliefs", "zebra", moderator=False)
    assert "canary_zebra_crossings" in topic.text
    typed = await command(runtime, "beliefs", "Zebra-Crossings", moderator=False)
    assert typed.ok and "canary_zebra_crossings" in typed.text  # as the engine names topics
    missing = await command(runtime, "beliefs", "tax_policy", moderator=False)
    assert not missing.ok and missing.private

    history = await command(runtime, "history", moderator=False)
    lines = history.text.splitlines()
    assert lines[0].startswith("v4 ") and "committed canary_zebra_crossings" in lines[0]
    assert lines[-1].startswith("v0 ") and "seed" in lines[-1]

    diff = await command(runtime, "diff", "0", "4", moderator=False)
    assert "+ canary_zebra_crossings: +0.038" in diff.text
    assert "Interactions: 0 → 4" in diff.text
    bad = await command(runtime, "diff", "0", "99", moderator=False)
    assert not bad.ok and "no version 99" in bad.text

    snapshot = await command(runtime, "snapshot", moderator=False)
    assert snapshot.text == SEED_SNAPSHOT
    status = await command(runtime, "status", moderator=False)
    assert "Interactions: 4" in status.text and "Beliefs: 1" in status.text
    assert "Pending insights: 1" in status.text
    helptext = await command(runtime, "help", moderator=False)
    assert "/sonality rollback" in helptext.text
    unknown = await command(runtime, "explode", moderator=False)
    assert not unknown.ok


async def test_non_moderator_rollback_is_refused_and_logged(runtime, llm_server):
    llm_server.brain.ess_rule(**CANARY)
    await teach_canary(runtime)
    store = runtime.db.community(A.id)
    before = await store.latest_version()
    result = await command(runtime, "rollback", "0", user=BOB, moderator=False)
    assert not result.ok and result.private
    assert "Only moderators" in result.text
    assert await store.latest_version() == before
    agent = runtime.registry.get(A.id)
    assert agent is not None
    assert "canary_zebra_crossings" in agent.sponge.opinion_vectors
    actions = await runtime.db.moderator_actions(A.id)
    assert actions[0].actor_id == BOB.id and actions[0].allowed is False
    reflect = await command(runtime, "reflect", user=BOB, moderator=False)
    assert not reflect.ok


async def test_rollback_to_seed_and_undo(runtime, llm_server):
    llm_server.brain.ess_rule(**CANARY)
    await teach_canary(runtime)
    agent = runtime.registry.get(A.id)
    assert agent.sponge.version == 4

    reset = await command(runtime, "rollback", "0", "spam", "raid", user=ALICE)
    assert reset.ok, reset.text
    assert "as v5" in reset.text and "rollback 4" in reset.text
    assert "no memories" in reset.text
    assert agent.sponge.version == 5
    assert agent.sponge.opinion_vectors == {}
    assert agent.sponge.snapshot == SEED_SNAPSHOT
    assert agent.sponge.interaction_count == 4  # the counter never goes backwards

    undo = await command(runtime, "rollback", "4", user=ALICE)
    assert undo.ok
    assert agent.sponge.version == 6
    assert agent.sponge.opinion_vectors["canary_zebra_crossings"] > 0

    history = await command(runtime, "history")
    assert "[rollback by Alice (u-alice)] rollback to v0: spam raid" in history.text
    nothing = await command(runtime, "rollback", "42")
    assert not nothing.ok and "no version 42" in nothing.text
    garbage = await command(runtime, "rollback", "latest")
    assert not garbage.ok and "not a valid version" in garbage.text
    actions = await runtime.db.moderator_actions(A.id)
    assert {a.allowed for a in actions} == {True}


async def test_autocomplete_versions_and_topics(runtime, llm_server):
    llm_server.brain.ess_rule(**CANARY)
    await teach_canary(runtime)
    versions = await runtime.complete(A, "version", "")
    assert versions[:2] == ["4", "3"] and "0" in versions
    topics = await runtime.complete(A, "topic", "zeb")
    assert topics == ["canary_zebra_crossings"]
    assert await runtime.complete(B, "topic", "") == []
