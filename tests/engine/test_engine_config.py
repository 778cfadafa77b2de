"""Each agent follows the `EngineConfig` it was given, not module globals: two agents in
one process with different values each keep their own, in learning and in a forget-me's
replay.

Same stand-ins as test_agent_learning: a scripted `LLMClient`, the real SQLite store and
an in-process memory.
"""

from __future__ import annotations

import asyncio

from sonality import config
from sonality.agent import SonalityAgent
from sonality.config import EngineConfig
from sonality.state import SpongeState
from sonality.store import Speaker
from storage import Database
from tests.engine import test_agent_learning as harness
from tests.engine.test_agent_learning import RecordingMemory, ScriptedLLM
from tests.engine.test_replay import argument

# Fixtures used here by name.
db = harness.db

ALICE = Speaker(id="u-alice", name="Alice")
BOB = Speaker(id="u-bob", name="Bob")


async def load(db: Database, community: str, tunables: EngineConfig) -> SonalityAgent:
    return await SonalityAgent.load(
        client=ScriptedLLM(),
        store=db.community(community),
        episodes=RecordingMemory(),
        config=tunables,
    )


async def say(agent: SonalityAgent, answer: dict[str, object], speaker: Speaker) -> None:
    assert isinstance(agent.client, ScriptedLLM)
    agent.client.ess.append(answer)
    await agent.respond("a message", speaker=speaker)


async def test_two_agents_in_one_process_each_follow_their_own_threshold(db: Database) -> None:
    """The same argument (ESS 0.5) teaches the agent whose bar is 0.3 and not the one
    whose bar is 0.6, learned side by side."""
    lenient = await load(db, "test:lenient", EngineConfig(ess_threshold=0.3))
    strict = await load(db, "test:strict", EngineConfig(ess_threshold=0.6))
    try:
        answer = argument("supports", ("tutoring",), score=0.5, novelty=0.8)
        await asyncio.gather(say(lenient, answer, ALICE), say(strict, answer, ALICE))
        await asyncio.gather(lenient.drain(), strict.drain())

        assert [u.topic for u in lenient.sponge.staged_opinion_updates] == ["tutoring"]
        assert lenient.sponge.behavioral_signature.topic_engagement == {"tutoring": 1}
        assert "insight" in lenient.client.purposes  # type: ignore[attr-defined]

        assert strict.sponge.staged_opinion_updates == []
        assert strict.sponge.behavioral_signature.topic_engagement == {}
        assert "insight" not in strict.client.purposes  # type: ignore[attr-defined]
        assert (lenient.sponge.interaction_count, strict.sponge.interaction_count) == (1, 1)
    finally:
        await lenient.close(grace_seconds=5)
        await strict.close(grace_seconds=5)


async def test_a_forget_me_replays_under_the_agents_own_cooling_period(db: Database) -> None:
    """The replay behind forget-me stages the remaining moves with the agent's cooling
    period (7 here), not the environment's."""
    agent = await load(db, "test:slow", EngineConfig(opinion_cooling_period=7))
    try:
        await say(agent, argument("supports", ("tutoring",), 0.8, 0.5), ALICE)  # 1
        await say(agent, argument("opposes", ("rent_control",), 0.8, 0.5), BOB)  # 2
        await agent.drain()
        staged = {u.topic: u.due_interaction for u in agent.sponge.staged_opinion_updates}
        assert staged == {"tutoring": 1 + 7, "rent_control": 2 + 7}

        state = await agent.forget_member(ALICE.id, actor="self")

        assert {u.topic: u.due_interaction for u in state.staged_opinion_updates} == {
            "rent_control": 2 + 7
        }
    finally:
        await agent.close(grace_seconds=5)


async def test_the_models_come_from_the_config_unless_named(db: Database) -> None:
    given = EngineConfig(model="reply-model", ess_model="evidence-model")
    agent = SonalityAgent(
        client=ScriptedLLM(),
        store=db.community("test:models"),
        episodes=RecordingMemory(),
        sponge=SpongeState(),
        config=given,
    )
    named = SonalityAgent(
        client=ScriptedLLM(),
        store=db.community("test:named"),
        episodes=RecordingMemory(),
        sponge=SpongeState(),
        model="other",
        config=given,
    )
    try:
        assert agent.config is given
        assert (agent.model, agent.ess_model) == ("reply-model", "evidence-model")
        assert (named.model, named.ess_model) == ("other", "evidence-model")
    finally:
        await agent.close(grace_seconds=5)
        await named.close(grace_seconds=5)


async def test_an_agent_given_no_config_follows_the_environments(db: Database) -> None:
    bare = SonalityAgent(
        client=ScriptedLLM(),
        store=db.community("test:bare"),
        episodes=RecordingMemory(),
        sponge=SpongeState(),
    )
    try:
        assert bare.config is config.ENVIRONMENT
        assert (bare.model, bare.ess_model) == (config.MODEL, config.ESS_MODEL)
    finally:
        await bare.close(grace_seconds=5)
