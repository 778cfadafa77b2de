"""Forget-me's core (issue 11, item 2): the member's influence replayed away, their rows
deleted and their id and words redacted from every SQLite table, a rollback to before the
forget-me not bringing them back, and a forget-me killed with SIGKILL finished on the
next start.

The engine harness of tests/engine/test_replay.py: real agents on the real SQLite file,
a scripted LLM (no reflection triggered by count or time; decays come from moderator
reflections at the same points in both communities).
"""

from __future__ import annotations

from typing import Any

from bot.commands import diff_states
from bot.forget_me import forget_member, reapply_after_rollback
from sonality.agent import SonalityAgent
from sonality.store import Speaker
from storage import Database
from tests.engine import test_replay as harness
from tests.engine.test_replay import ALICE, BOB, TOPICS, ScriptedLLM, script
from tests.integration.forget_scenario import TOKEN, assert_same_opinions_rebased, file_bytes

# The harness's fixtures, used here by name.
agents = harness.agents
db = harness.db


def with_token(steps: list[tuple[Speaker, dict[str, Any] | None]]) -> list[tuple[Speaker, Any]]:
    """Alice's ESS summaries quote her unique word (so redaction of past versions matters)."""
    out: list[tuple[Speaker, Any]] = []
    for who, answer in steps:
        if answer is not None and who is ALICE:
            answer = {**answer, "summary": f"Alice argues {TOKEN} for it."}
        out.append((who, answer))
    return out


async def run(agent: SonalityAgent, llm: ScriptedLLM, steps: list[tuple[Speaker, Any]]) -> None:
    for n, (speaker, answer) in enumerate(steps):
        if answer is None:
            await agent.reflect_now("moderator", actor="mod")
            continue
        llm.ess.append(answer)
        words = f"{TOKEN} message {n}" if speaker is ALICE else f"message {n}"
        await agent.respond(words, speaker=speaker)
        await agent.drain()


async def test_forget_me_removes_the_member_and_their_influence(agents, db: Database, tmp_path):
    steps = with_token(script(4, 40))
    whole, whole_llm = agents["test:whole"]
    fresh, fresh_llm = agents["test:fresh"]
    await run(whole, whole_llm, steps)
    await run(fresh, fresh_llm, [(w, a) for w, a in steps if w is not ALICE])
    raw = file_bytes(db.path)  # the scan below can fail: both are there now
    assert TOKEN.encode() in raw and ALICE.id.encode() in raw
    bob_before = await db.member_interaction_ids("test:whole", BOB.id)
    before = whole.sponge

    request = await forget_member(db, whole, "test:whole", ALICE.id, requested_by="self")

    assert_same_opinions_rebased(whole.sponge, fresh.sponge)
    assert whole.sponge.interaction_count == before.interaction_count  # rebased, monotonic
    assert request.pseudonym.startswith("member-") and request.version == whole.sponge.version
    [latest] = await db.community("test:whole").versions(limit=1)
    assert latest.cause == "forget-me" and latest.actor == request.pseudonym
    diff = diff_states(before, whole.sponge)
    assert any(topic in diff for topic in TOPICS)
    # Nothing of Alice is left in the database file (secure_delete + WAL truncated).
    raw = file_bytes(db.path)
    assert TOKEN.encode() not in raw and ALICE.id.encode() not in raw
    # The others' data is untouched.
    assert await db.member_interaction_ids("test:whole", BOB.id) == bob_before
    assert {s.member for s in await db.community("test:whole").evidence()} >= {BOB.id}
    # Past versions still open, keep their opinions, and name her only by pseudonym.
    store = db.community("test:whole")
    old = await store.state_at(before.version)
    assert old is not None and old.opinion_vectors == before.opinion_vectors
    members = {m.member for meta in old.belief_meta.values() for m in meta.moved_by}
    assert ALICE.id not in members
    await db.close()
    raw = file_bytes(db.path)
    assert TOKEN.encode() not in raw and ALICE.id.encode() not in raw


async def test_a_rollback_to_before_the_forget_me_does_not_bring_the_influence_back(
    agents, db: Database
):
    steps = with_token(script(5, 40))
    whole, whole_llm = agents["test:whole"]
    fresh, fresh_llm = agents["test:fresh"]
    half = 20
    await run(whole, whole_llm, steps[:half])
    target = whole.sponge.version
    with_alice_then = whole.sponge.model_copy(deep=True)
    await run(fresh, fresh_llm, [(w, a) for w, a in steps[:half] if w is not ALICE])
    await run(whole, whole_llm, steps[half:])
    await forget_member(db, whole, "test:whole", ALICE.id, requested_by="self")

    restored = await whole.rollback(target, actor="mod")
    # Without the re-apply, the restored state holds her influence again.
    assert restored.opinion_vectors == with_alice_then.opinion_vectors
    assert await reapply_after_rollback(db, whole, "test:whole", target)
    assert_same_opinions_rebased(whole.sponge, fresh.sponge)
    assert any(
        abs(with_alice_then.opinion_vectors.get(t, 0) - whole.sponge.opinion_vectors.get(t, 0))
        > 1e-3
        for t in TOPICS
    )
    # A rollback to after the forget-me needs nothing re-applied.
    assert not await reapply_after_rollback(db, whole, "test:whole", whole.sponge.version)
