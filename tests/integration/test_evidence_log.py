"""Every commit records what an exact replay of the opinions needs (issue 11): each
learned message's full ESS result and speaker, each decay with its rate, each rollback,
in commit order, in a table of its own (audit retention cannot break a replay)."""

from __future__ import annotations

from sonality import config
from tests.integration.conftest import ALICE, BOB, A, command, say
from tests.integration.test_isolation_and_commands import CANARY, CANARY_TEXT


async def test_messages_decays_and_rollbacks_are_logged_in_commit_order(runtime, llm_server):
    llm_server.brain.ess_rule(**CANARY)
    await say(runtime, CANARY_TEXT, user=ALICE)  # v1
    await say(runtime, "hello there", user=BOB)  # v2
    assert (await command(runtime, "reflect")).ok  # v3: decay, then the narrative
    assert (await command(runtime, "rollback", "1")).ok  # v4

    store = runtime.db.community(A.id)
    steps = await store.evidence()
    assert [(s.kind, s.interaction, s.member) for s in steps] == [
        ("message", 1, ALICE.id),
        ("message", 2, BOB.id),
        ("decay", 2, ""),
        ("rollback", 2, ""),
    ]
    first = steps[0]
    assert first.ess is not None and first.interaction_id
    assert (first.ess.score, first.ess.novelty, first.ess.topics) == (
        0.85,
        0.9,
        ("canary_zebra_crossings",),
    )
    assert first.ess.opinion_direction == "supports" and first.ess.internal_consistency
    assert first.ess.reasoning_type == "empirical_data"
    assert steps[2].rate == config.BELIEF_DECAY_RATE
    assert steps[3].target_version == 1
    # The interaction ids are those of the outbox rows the commits acknowledged.
    pending_ids = {s.interaction_id for s in steps if s.kind == "message"}
    assert len(pending_ids) == 2
