"""`/sonality forget-me` and `/sonality forget-user` through the real runtime (terminal's
command path), the real SDK and the loopback LLM fake (issue 11, items 2 and 3).

Covered here: confirmation first, the member's rows and words gone from the SQLite
file, the others' untouched, opinions recomputed, the moderator variant logged without
the member's identity, and a rollback that keeps the forget-me in force. (Chroma
episodes are not deleted yet; see bot/forget_me.py.)
"""

from __future__ import annotations

from bot.messages import User
from tests.integration.conftest import ALICE, BOB, A, command, say
from tests.integration.test_forget_core import file_bytes

TOKEN = "quokkazebra77"
CAROL = User(id="u-carol", name="Carol")
RULES = [
    dict(
        contains=TOKEN,
        score=0.9,
        direction="supports",
        topics=["canary_rent_control"],
        novelty=0.9,
        reasoning_type="empirical_data",
        source_reliability="peer_reviewed",
        summary=f"User cites the {TOKEN} housing study in favour of rent control.",
    ),
    dict(
        contains="vacancy survey",
        score=0.8,
        direction="opposes",
        topics=["canary_rent_control"],
        novelty=0.7,
        reasoning_type="empirical_data",
        source_reliability="peer_reviewed",
        summary="User cites a vacancy survey against rent control.",
    ),
]


async def argue(runtime) -> None:
    await say(runtime, f"The {TOKEN} study shows rent control keeps people housed.", user=ALICE)
    await say(runtime, "A vacancy survey shows rent control shrinks supply.", user=BOB)
    for i in range(4):
        await say(runtime, f"nice weather {i}", user=CAROL)


async def test_forget_me_asks_first_then_forgets_the_member(runtime, llm_server):
    for rule in RULES:
        llm_server.brain.ess_rule(**rule)
    await argue(runtime)
    agent = runtime.registry.get(A.id)
    assert agent is not None
    with_alice = agent.sponge.opinion_vectors["canary_rent_control"]
    raw = file_bytes(runtime.db.path)
    assert TOKEN.encode() in raw and ALICE.id.encode() in raw

    ask = await command(runtime, "forget-me", moderator=False)
    assert ask.private and "forget-me confirm" in ask.text
    assert await runtime.db.member_interaction_ids(A.id, ALICE.id)  # nothing happened yet

    done = await command(runtime, "forget-me", "confirm", moderator=False)
    assert done.ok and "Forgotten, as member-" in done.text
    assert "canary_rent_control" in done.text  # the per-topic change is shown
    # No reflection has run: the self-description is the seed's, nothing to wait for.
    assert "self-description" not in done.text
    without = agent.sponge.opinion_vectors["canary_rent_control"]
    assert without < 0 < with_alice  # only Bob's argument is left
    raw = file_bytes(runtime.db.path)
    assert TOKEN.encode() not in raw and ALICE.id.encode() not in raw
    assert len(await runtime.db.member_interaction_ids(A.id, BOB.id)) == 1
    assert len(await runtime.db.member_interaction_ids(A.id, CAROL.id)) == 4
    history = await command(runtime, "history", moderator=False)
    assert "[forget-me by member-" in history.text


async def test_after_a_reflection_forget_me_says_the_self_description_lags(runtime, llm_server):
    for rule in RULES:
        llm_server.brain.ess_rule(**rule)
    await argue(runtime)
    assert (await command(runtime, "reflect")).ok
    agent = runtime.registry.get(A.id)
    assert agent is not None and agent.sponge.last_reflection_at > 0

    done = await command(runtime, "forget-me", "confirm", moderator=False)
    assert done.ok and "self-description still reflects them" in done.text


async def test_forget_user_is_for_moderators_and_never_logs_the_member(runtime, llm_server):
    for rule in RULES:
        llm_server.brain.ess_rule(**rule)
    await argue(runtime)
    refused = await command(
        runtime, "forget-user", ALICE.id, "asked by email", user=CAROL, moderator=False
    )
    assert not refused.ok and await runtime.db.member_interaction_ids(A.id, ALICE.id)

    done = await command(runtime, "forget-user", ALICE.id, "asked by email", user=BOB)
    assert done.ok
    actions = await runtime.db.moderator_actions(A.id)
    newest, refused_row = actions[0], actions[1]  # newest first
    assert (newest.action, newest.allowed, refused_row.allowed) == ("forget-user", True, False)
    assert newest.reason == "asked by email" and ALICE.id not in newest.args
    raw = file_bytes(runtime.db.path)
    assert TOKEN.encode() not in raw and ALICE.id.encode() not in raw


async def test_a_rollback_to_before_forget_me_keeps_the_member_forgotten(runtime, llm_server):
    for rule in RULES:
        llm_server.brain.ess_rule(**rule)
    await argue(runtime)
    agent = runtime.registry.get(A.id)
    assert agent is not None
    with_alice = dict(agent.sponge.opinion_vectors)
    before_forget = agent.sponge.version
    await command(runtime, "forget-me", "confirm", moderator=False)
    forgotten = dict(agent.sponge.opinion_vectors)
    assert forgotten != with_alice

    back = await command(runtime, "rollback", str(before_forget))
    assert back.ok
    assert agent.sponge.opinion_vectors == forgotten
    assert agent.sponge.opinion_vectors != with_alice


async def test_status_no_longer_describes_a_forgotten_members_last_message(
    runtime, llm_server
) -> None:
    """`status` names the last message's rating and topic; once its author is forgotten
    it must not, while a message of someone else's still shows."""
    for rule in RULES:
        llm_server.brain.ess_rule(**rule)
    await say(runtime, "A vacancy survey shows rent control shrinks supply.", user=BOB)
    await say(runtime, f"The {TOKEN} study shows rent control keeps people housed.", user=ALICE)
    before = await command(runtime, "status", user=CAROL, moderator=False)
    assert "Last message: ESS 0.90" in before.text, before.text  # Alice's

    assert (await command(runtime, "forget-me", "confirm", moderator=False)).ok
    after = await command(runtime, "status", user=CAROL, moderator=False)
    assert "Last message" not in after.text, after.text

    await say(runtime, "A vacancy survey shows rent control shrinks supply.", user=BOB)
    again = await command(runtime, "status", user=CAROL, moderator=False)
    assert "Last message: ESS 0.80" in again.text
