"""Credit for an opinion move follows the argument that caused it.

A committed move used to be shown on whichever message closed its cooling period, so a
troll's pressure message could take the credit for someone else's argument. The real
runtime, real SDK and the fake LLM server: the ESS answers are scripted per message.
"""

from __future__ import annotations

from bot.messages import User
from tests.integration.conftest import ALICE, A, command, say
from tests.integration.test_isolation_and_commands import CANARY, CANARY_TEXT

TROLL = User(id="u-troll", name="Troll")


async def test_a_troll_closing_the_cooling_period_does_not_take_the_credit(runtime, llm_server):
    llm_server.brain.ess_rule(**CANARY)
    llm_server.brain.ess_rule(
        contains="PRESSURE",
        score=0.05,
        direction="opposes",
        topics=["canary_zebra_crossings"],
        summary="User insists without giving any reason.",
    )
    await say(runtime, CANARY_TEXT, user=ALICE)  # v1 stages Alice's update
    for i in range(3):  # v2-v4: the troll's last message closes the cooling period
        await say(runtime, f"PRESSURE {i}: just agree with me", user=TROLL)

    agent = runtime.registry.get(A.id)
    assert agent is not None
    meta = agent.sponge.belief_meta["canary_zebra_crossings"]
    assert [(m.member, m.version) for m in meta.moved_by] == [(ALICE.id, 1)]
    assert meta.moved_by[0].interaction_id  # the message itself is named

    history = await command(runtime, "history", moderator=False)
    lines = history.text.splitlines()
    v4 = next(line for line in lines if line.startswith("v4 "))
    # The commit comes first, with the argument that caused it: member, version, rating;
    # the troll's message it happened during follows, marked as such.
    commit, during = v4.split("[interaction] ", 1)[1].split(" | during: ")
    assert commit.startswith("committed canary_zebra_crossings")
    assert commit.endswith("argued by Alice (v1, ESS 0.85)")
    assert during.startswith("ESS 0.05 ")
    assert "Troll" not in v4 and TROLL.id not in v4
    # The version that staged Alice's argument is a line of its own, never folded as chat.
    assert any(line.startswith("v1 ") and "staged canary_zebra_crossings" in line for line in lines)
    everything = await command(runtime, "history", "all", moderator=False)
    assert "argued by Alice (v1, ESS 0.85)" in everything.text
    assert "Troll" not in everything.text

    beliefs = await command(runtime, "beliefs", moderator=False)
    assert "last moved by Alice (v1)" in beliefs.text
    assert "Troll" not in beliefs.text


async def test_after_a_rollback_status_tells_the_restored_versions_reflection(
    runtime, llm_server
) -> None:
    """Rolled back to a version from before any reflection, status must not report one
    (the rebased counter used to read as a reflection at the rollback's interaction)."""
    for i in range(3):
        await say(runtime, f"Just chatting, message {i}.", user=ALICE)
    before = await command(runtime, "status")
    assert "Last reflection: none yet" in before.text
    reflected = await command(runtime, "reflect")
    assert reflected.ok, reflected.text
    assert "Last reflection: at interaction 3" in (await command(runtime, "status")).text
    rolled = await command(runtime, "rollback", "1", "undo")
    assert rolled.ok, rolled.text
    after = await command(runtime, "status")
    assert "Last reflection: none yet" in after.text
