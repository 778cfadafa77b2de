"""Forget-me with a reply in flight, and the member's life after it (issue 22, findings
1 and 3), through the real runtime, the Anthropic SDK and the loopback fake.

Finding 1: Alice's reply is slow; she confirms forget-me meanwhile. Her message must end
either erased with the rest or never recorded: no row in `interactions` or
`conversation_turns`, and nothing learned from it, not even after a restart.
Finding 3: what she says after her forget-me is learned at once, like anyone's.
A moderator's rollback between her forget-me's replay and its erase keeps her forgotten.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from app.wiring import open_runtime
from bot.messages import ReplyKind
from tests.fakes.anthropic_server import AnthropicFake
from tests.integration.conftest import (
    ALICE,
    BOB,
    A,
    command,
    ess_requests,
    make_settings,
    prompt_of,
    say,
)
from tests.integration.forget_scenario import (
    GLIMMER,
    file_bytes,
    rate_glimmer,
    reflect_at_the_delete,
    reply_in_flight,
)

WORD = "lanternquince91"


def teach(server: AnthropicFake) -> None:
    for marker, direction in (("(argfor)", "supports"), ("(argvs)", "opposes")):
        server.brain.ess_rule(
            contains=marker,
            score=0.8,
            direction=direction,
            topics=["rent_control"],
            novelty=0.8,
            reasoning_type="empirical_data",
            source_reliability="peer_reviewed",
            summary=f"The sender cites a study {direction} rent control.",
        )


async def test_a_reply_in_flight_during_forget_me_is_neither_kept_nor_learned(
    tmp_path: Path, llm: Any, anthropic_server: AnthropicFake
) -> None:
    teach(anthropic_server)
    settings = make_settings(tmp_path / "data", llm=llm)
    async with open_runtime(settings, llm=llm) as runtime:
        await say(runtime, f"The {WORD} survey favours rent control (argfor).")
        await say(runtime, "A vacancy study says otherwise (argvs).", user=BOB)
        slow = await reply_in_flight(
            runtime, anthropic_server, A, ALICE, f"And the {WORD} follow-up agrees (argfor)."
        )
        done = await command(runtime, "forget-me", "confirm", moderator=False)
        assert done.ok and "Forgotten" in done.text
        reply = await slow
        assert reply is not None and reply.kind is ReplyKind.ANSWER  # she still got it
        await runtime.drain()

        rows = await runtime.db.member_rows(A.id, ALICE.id)
        assert rows.messages == () and rows.conversation_turns == ()
        assert rows.evidence == () and rows.ratings == ()
        assert (await runtime.db.member_words(A.id, ALICE.id)).texts == ()
    assert WORD.encode() not in file_bytes(settings.resolved_database_path)
    learned = len(ess_requests(anthropic_server))

    # The forgotten set is the store's: a restart learns nothing of hers either.
    async with open_runtime(settings, llm=llm) as runtime:
        await runtime.drain()
        assert await runtime.db.community(A.id).pending_interactions() == []
        [latest] = await runtime.db.community(A.id).versions(limit=1)
        assert latest.cause == "forget-me"
    assert len(ess_requests(anthropic_server)) == learned
    assert not [r for r in ess_requests(anthropic_server) if "follow-up" in r.user_text]


async def test_after_forget_me_the_member_is_learned_again_at_once(
    tmp_path: Path, llm: Any, anthropic_server: AnthropicFake
) -> None:
    teach(anthropic_server)
    settings = make_settings(tmp_path / "data", llm=llm)
    async with open_runtime(settings, llm=llm) as runtime:
        await say(runtime, "Rent control keeps people housed (argfor).")
        await command(runtime, "forget-me", "confirm", moderator=False)
        store = runtime.db.community(A.id)
        [forgot] = await store.versions(limit=1)

        await say(runtime, "Starting over: rent control still helps (argfor).")

        assert await store.pending_interactions() == []
        [learned] = await store.versions(limit=1)
        assert (learned.version, learned.cause) == (forgot.version + 1, "interaction")
        [rating] = await store.audit_events(kind="ess", limit=1)
        assert rating.payload["speaker"] == ALICE.id and rating.version == learned.version
        agent = runtime.registry.get(A.id)
        assert agent is not None
        assert [(u.topic, u.member) for u in agent.sponge.staged_opinion_updates] == [
            ("rent_control", ALICE.id)
        ]


async def test_a_rollback_between_the_replay_and_the_erase_keeps_the_member_forgotten(
    runtime: Any, anthropic_server: AnthropicFake, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Her forget-me has committed its replayed version, and its erase is still to
    come, when a moderator rolls back to before it: the restored state must be replayed
    without her again, or her staged moves come back and the next commit stores her id."""
    teach(anthropic_server)
    await say(runtime, "The survey favours rent control (argfor).")
    await say(runtime, "A vacancy study says otherwise (argvs).", user=BOB)
    await say(runtime, "And the follow-up agrees (argfor).")
    agent = runtime.registry.get(A.id)
    assert agent is not None
    assert ALICE.id in {u.member for u in agent.sponge.staged_opinion_updates}
    before = agent.sponge.version
    erase = runtime.db.erase_member
    rolled: list[Any] = []

    async def rollback_first(request: Any, words: Any, at: Any) -> int:
        rolled.append(await command(runtime, "rollback", str(before), "oops", user=BOB))
        return await erase(request, words, at)

    monkeypatch.setattr(runtime.db, "erase_member", rollback_first)
    done = await command(runtime, "forget-me", "confirm", moderator=False)
    monkeypatch.setattr(runtime.db, "erase_member", erase)
    assert done.ok and "Forgotten" in done.text
    assert [r.ok for r in rolled] == [True]

    assert ALICE.id not in agent.sponge.model_dump_json()
    await say(runtime, "Unrelated chatter.", user=BOB)
    store = runtime.db.community(A.id)
    [latest] = await store.versions(limit=1)
    state = await store.state_at(latest.version)
    assert state is not None and ALICE.id not in state.model_dump_json()


async def test_a_reflection_asked_during_forget_me_never_reads_the_members_memories(
    runtime: Any, anthropic_server: AnthropicFake, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A moderator's reflect arrives just as the forget-me's replay is committed, before
    its memories are deleted from Chroma. The reflection reads the recent memories'
    summaries into its prompt: it must wait until hers are gone, or her words live on
    in the narrative and in the insights it writes."""
    rate_glimmer(anthropic_server)
    await say(runtime, "The survey favours rent control (glimmer).")
    await say(runtime, "Nice weather today.", user=BOB)
    agent = runtime.registry.get(A.id)
    assert agent is not None
    await agent.flush_episodes()
    reflecting = reflect_at_the_delete(runtime, agent, monkeypatch, A, BOB)
    before = len(anthropic_server.requests)
    done = await command(runtime, "forget-me", "confirm", moderator=False)
    assert done.ok and "Forgotten" in done.text
    [reflected] = await asyncio.gather(*reflecting)
    assert reflected.ok, reflected.text
    asked = [prompt_of(r) for r in anthropic_server.requests[before:]]
    assert asked, "the reflection asked the model nothing"
    assert not [p for p in asked if GLIMMER in p]
