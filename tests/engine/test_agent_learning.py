"""The agent's learning rules: when reflection runs, what a reflection does with pending
insights, and that a staged belief move commits to exactly what was staged.

Why a scripted in-process `LLMClient` here instead of the integration runtime with the
loopback vendor fake: these tests are about the engine's arithmetic and trigger rules,
which need exact control over the state (interaction counts, shifts, beliefs) and over
what each model call answers. The vendor SDK boundary is not involved and is covered by
tests/llm and tests/integration; going through it would add an embedding model, Chroma
and HTTP without making any assertion here stronger. The store is the real SQLite one
(cheap, and the commits are part of what is checked); episode memory is an in-process
stand-in that records what the agent writes to it.
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from chromadb.api.types import Embeddings

from sonality.agent import SonalityAgent
from sonality.config import EngineConfig
from sonality.llm import ChatTurn, LLMError, SystemBlock, TextResult, TextSink, ToolResult
from sonality.memory.episodes import document_of
from sonality.state import SEED_SNAPSHOT, BeliefMeta, Shift, SpongeState
from sonality.store import SEMANTIC, AuditEvent, Episode, UsageRecord
from storage import Database

COMMUNITY = "test:engine"
NO_ARGUMENT: dict[str, Any] = {
    "score": 0.0,
    "reasoning_type": "no_argument",
    "source_reliability": "not_applicable",
    "internal_consistency": True,
    "novelty": 0.0,
    "topics": [],
    "summary": "Small talk.",
    "opinion_direction": "neutral",
}
# Long enough to pass snapshot validation against the seed narrative.
GOOD_REFLECTION = SEED_SNAPSHOT + " Lately I have learned to ask for the control group."
SHORT_REFLECTION = "I like maths."  # far under 60% of the old narrative: rejected


class ScriptedLLM:
    """An `LLMClient` answering from a script; records the purpose of every call."""

    def __init__(self) -> None:
        self.ess: list[dict[str, Any]] = []  # answered in order, then NO_ARGUMENT
        self.reflection: str | LLMError = GOOD_REFLECTION
        self.insight = "NONE"
        self.purposes: list[str] = []

    async def reply(
        self,
        *,
        system: Sequence[SystemBlock],
        messages: Sequence[ChatTurn],
        max_tokens: int,
        model: str | None = None,
        purpose: str = "reply",
        on_text: TextSink | None = None,
    ) -> TextResult:
        self.purposes.append(purpose)
        if purpose == "reflection":
            if isinstance(self.reflection, LLMError):
                raise self.reflection
            return TextResult(text=self.reflection, model="scripted")
        if purpose == "insight":
            return TextResult(text=self.insight, model="scripted")
        if on_text is not None:
            await on_text("Noted.")
        return TextResult(text="Noted.", model="scripted")

    async def call_tool(
        self,
        *,
        system: Sequence[SystemBlock],
        messages: Sequence[ChatTurn],
        tool: dict[str, Any],
        max_tokens: int,
        model: str | None = None,
        purpose: str = "tool",
    ) -> ToolResult:
        self.purposes.append(purpose)
        answer = self.ess.pop(0) if self.ess else NO_ARGUMENT
        return ToolResult(tool_input=answer, model="scripted")

    @property
    def reflections(self) -> int:
        return self.purposes.count("reflection")


class RecordingMemory:
    """An `EpisodeMemory` that keeps what is written and recalls nothing."""

    def __init__(self) -> None:
        self.writes: list[Episode] = []  # every write, in order
        self.by_id: dict[str, Episode] = {}  # what an upsert by id (Chroma) keeps

    def embed_many(self, texts: Sequence[str]) -> Embeddings:
        return [np.full(4, 0.5, dtype=np.float32) for _ in texts]

    def store_many(self, episodes: Sequence[Episode]) -> None:
        self.writes.extend(episodes)
        self.by_id.update((e.id, e) for e in episodes)

    def delete(self, ids: Sequence[str]) -> None:
        for i in ids:
            self.by_id.pop(i, None)

    # Recall takes whatever filters the agent passes (they change as the engine grows);
    # this memory recalls nothing, so none of them matter here.
    def retrieve_typed(self, *args: Any, **kwargs: Any) -> list[str]:
        return []

    def retrieve(self, *args: Any, **kwargs: Any) -> list[str]:
        return []

    def recent_summaries(self, *args: Any, **kwargs: Any) -> list[str]:
        return []

    def count(self) -> int:
        return len(self.writes)

    def stored(self, ids: Sequence[str]) -> list[dict[str, Any]]:
        return [{"id": i, "document": document_of(self.by_id[i])} for i in ids if i in self.by_id]

    def semantic_ids(self, documents: Sequence[str]) -> list[str]:
        wanted = set(documents)
        return sorted(
            i
            for i, e in self.by_id.items()
            if e.memory_type == SEMANTIC and document_of(e) in wanted
        )


@pytest.fixture
def tunables() -> EngineConfig:
    """The agent's config: the seed's values (threshold 0.3, dampening until 10, cooling
    3, reflection every 20), whatever the environment running the tests configured. A
    test parametrizing `tunables` gives its agent other values."""
    return EngineConfig()


@pytest.fixture
def llm() -> ScriptedLLM:
    return ScriptedLLM()


@pytest.fixture
def memory() -> RecordingMemory:
    return RecordingMemory()


@pytest.fixture
async def db(tmp_path: Path) -> AsyncIterator[Database]:
    database = await Database.open(tmp_path / "bot.sqlite3")
    try:
        yield database
    finally:
        await database.close()


@pytest.fixture
async def agent(
    db: Database, llm: ScriptedLLM, memory: RecordingMemory, tunables: EngineConfig
) -> AsyncIterator[SonalityAgent]:
    loaded = await SonalityAgent.load(
        client=llm,
        store=db.community(COMMUNITY),
        episodes=memory,
        model="m",
        ess_model="m",
        config=tunables,
    )
    try:
        yield loaded
    finally:
        await loaded.close(grace_seconds=5)


def install(agent: SonalityAgent, state: SpongeState) -> None:
    """Make `state` the agent's current one; the next commit is version 1."""
    state.version = agent.sponge.version
    agent.sponge = state


def shift(interaction: int, magnitude: float) -> Shift:
    return Shift(
        interaction=interaction,
        timestamp="2025-01-01T00:00:00+00:00",
        description="a move",
        magnitude=magnitude,
    )


# --- when reflection runs -------------------------------------------------------------------

LAST = 100  # the last reflection happened at interaction 100
# The agent's config (the `tunables` fixture, overridden by the parameter).
EVERY_20 = EngineConfig(reflection_every=20)
EVERY_7 = EngineConfig(reflection_every=7)


@pytest.mark.parametrize(
    ("tunables", "since", "shifts", "trigger"),
    [
        # A big cumulative shift, but fewer than half the interval since the last one.
        pytest.param(EVERY_20, 9, [(101, 0.06), (109, 0.06)], None, id="shift-before-half"),
        # Exactly half the interval: the shift triggers it. Two moves of 0.06 each are
        # under the threshold alone; their sum is over it.
        pytest.param(EVERY_20, 10, [(101, 0.06), (110, 0.06)], "shift 0.120", id="shift-at-half"),
        # Only shifts after the last reflection count.
        pytest.param(EVERY_20, 10, [(LAST, 0.5), (110, 0.06)], None, id="old-shift-ignored"),
        # The threshold is strict: 0.1 is not more than 0.1.
        pytest.param(EVERY_20, 10, [(105, 0.05), (110, 0.05)], None, id="shift-at-threshold"),
        pytest.param(EVERY_20, 19, [], None, id="quiet-before-period"),
        pytest.param(EVERY_20, 20, [], "periodic", id="periodic"),
        pytest.param(EVERY_20, 20, [(110, 0.5)], "periodic", id="periodic-with-shift"),
        # An odd interval: half is rounded down (7 // 2 == 3).
        pytest.param(EVERY_7, 2, [(102, 0.5)], None, id="odd-interval-before-half"),
        pytest.param(EVERY_7, 3, [(103, 0.5)], "shift 0.500", id="odd-interval-at-half"),
        pytest.param(EVERY_7, 7, [], "periodic", id="odd-interval-periodic"),
    ],
)
async def test_reflection_triggers_and_the_half_interval_guard(
    agent: SonalityAgent,
    llm: ScriptedLLM,
    tunables: EngineConfig,
    since: int,
    shifts: list[tuple[int, float]],
    trigger: str | None,
) -> None:
    assert agent.config is tunables  # the agent follows the interval given to it
    state = SpongeState(
        interaction_count=LAST + since,
        last_reflection_at=LAST,
        recent_shifts=[shift(i, m) for i, m in shifts],
    )
    events: list[AuditEvent] = []
    usage: list[UsageRecord] = []
    outcome = await agent._maybe_reflect(state, usage, events, [])

    if trigger is None:
        assert outcome is None
        assert llm.reflections == 0 and events == [] and usage == []
        assert state.last_reflection_at == LAST
    else:
        assert outcome is not None and outcome.ran and outcome.accepted
        assert outcome.reason == trigger
        assert llm.reflections == 1
        assert state.last_reflection_at == LAST + since
        assert state.snapshot == GOOD_REFLECTION
        assert [e.kind for e in events] == ["reflection"]
        assert events[0].payload["trigger"] == trigger


async def test_a_reflection_resets_the_shift_so_the_next_waits_for_the_interval(
    agent: SonalityAgent, llm: ScriptedLLM
) -> None:
    """After a shift-triggered reflection the same shifts no longer count, and the next
    early one again needs half an interval."""
    state = SpongeState(
        interaction_count=LAST + 10,
        last_reflection_at=LAST,
        recent_shifts=[shift(LAST + 10, 0.5)],
    )
    assert await agent._maybe_reflect(state, [], [], []) is not None
    state.interaction_count += 9
    state.recent_shifts.append(shift(state.interaction_count, 0.5))
    assert await agent._maybe_reflect(state, [], [], []) is None
    state.interaction_count += 1
    outcome = await agent._maybe_reflect(state, [], [], [])
    assert outcome is not None and outcome.reason == "shift 0.500"
    assert llm.reflections == 2


# --- what a reflection does with pending insights ---------------------------------------------

INSIGHTS = ["Asks for the control group first.", "Admits uncertainty readily."]


def with_insights() -> SpongeState:
    return SpongeState(
        interaction_count=42,
        last_reflection_at=30,
        pending_insights=list(INSIGHTS),
    )


@pytest.mark.parametrize(
    ("answer", "accepted"),
    [
        pytest.param(SHORT_REFLECTION, False, id="rejected"),
        pytest.param(GOOD_REFLECTION, True, id="accepted"),
    ],
)
async def test_a_reflection_that_ran_consumes_insights_into_semantic_memory(
    agent: SonalityAgent,
    llm: ScriptedLLM,
    memory: RecordingMemory,
    db: Database,
    answer: str,
    accepted: bool,
) -> None:
    install(agent, with_insights())
    llm.reflection = answer

    outcome = await agent.reflect_now("moderator", actor="mod-1")

    assert outcome.ran and outcome.accepted is accepted
    assert agent.sponge.pending_insights == []
    assert agent.sponge.snapshot == (GOOD_REFLECTION if accepted else SEED_SNAPSHOT)
    assert agent.sponge.last_reflection_at == 42
    store = db.community(COMMUNITY)
    assert await store.latest_state() == agent.sponge
    assert agent.sponge.version == 1
    [event] = await store.audit_events(kind="reflection")
    assert event.payload["ran"] and event.payload["accepted"] is accepted

    await agent.flush_episodes()
    semantic = [e for e in memory.writes if e.memory_type == SEMANTIC]
    assert [e.summary for e in semantic] == INSIGHTS
    assert [e.user_message for e in semantic] == INSIGHTS
    assert all(e.interaction == 42 for e in semantic)
    assert len({e.id for e in semantic}) == len(INSIGHTS)
    assert await store.pending_episodes() == []

    # The insights are gone for good: the next reflection sees none and writes none.
    llm.reflection = GOOD_REFLECTION
    await agent.reflect_now("moderator")
    await agent.flush_episodes()
    assert len([e for e in memory.writes if e.memory_type == SEMANTIC]) == len(INSIGHTS)


async def test_a_reflection_that_could_not_run_keeps_the_insights(
    agent: SonalityAgent, llm: ScriptedLLM, memory: RecordingMemory, db: Database
) -> None:
    install(agent, with_insights())
    llm.reflection = LLMError("provider down")

    outcome = await agent.reflect_now("moderator")

    assert not outcome.ran and outcome.error == "provider down"
    assert agent.sponge.pending_insights == INSIGHTS
    assert agent.sponge.snapshot == SEED_SNAPSHOT and agent.sponge.last_reflection_at == 30
    await agent.flush_episodes()
    assert memory.writes == []
    assert await db.community(COMMUNITY).latest_state() == SpongeState()  # still the seed


# --- a staged move commits to exactly what was staged ------------------------------------------


def argument(direction: str, *topics: str) -> dict[str, Any]:
    return {
        "score": 0.8,
        "reasoning_type": "empirical_data",
        "source_reliability": "peer_reviewed",
        "internal_consistency": True,
        "novelty": 0.5,
        "topics": list(topics),
        "summary": "A randomised trial with 2,000 pupils.",
        "opinion_direction": direction,
    }


async def test_a_staged_move_commits_after_the_cooling_period_exactly(
    agent: SonalityAgent, llm: ScriptedLLM, db: Database
) -> None:
    """Through the agent's whole learning path: an argument against a held stance is
    staged with resistance, nothing moves during the cooling period, and then each
    stance moves by exactly the staged delta (clamped to [-1, 1])."""
    install(
        agent,
        SpongeState(
            interaction_count=30,
            last_reflection_at=30,
            opinion_vectors={"tutoring": 0.4, "homework": -0.97},
            belief_meta={
                "tutoring": BeliefMeta(confidence=0.5, evidence_count=3, last_reinforced=30),
                "homework": BeliefMeta(confidence=0.2, evidence_count=1, last_reinforced=30),
            },
        ),
    )
    # Mature (30 >= 10): magnitude 0.1 * 0.8 * 0.5 = 0.04.
    tutoring_delta = -0.04 / (0.5 + 0.4 + 1)  # against +0.4
    homework_delta = -0.04 / (0.2 + 1)  # same side as -0.97
    llm.ess = [argument("opposes", "tutoring", "homework")]

    await agent.respond("Tutoring and homework do not help, says this trial.")
    await agent.drain()
    staged = {u.topic: u for u in agent.sponge.staged_opinion_updates}
    assert math.isclose(staged["tutoring"].signed_magnitude, tutoring_delta, rel_tol=1e-12)
    assert math.isclose(staged["homework"].signed_magnitude, homework_delta, rel_tol=1e-12)
    assert {u.due_interaction for u in staged.values()} == {34}
    [ess_event] = await db.community(COMMUNITY).audit_events(kind="ess")
    assert ess_event.payload["disagreed"] is True  # opposes vs +0.4

    for count in (32, 33):  # still cooling
        await agent.respond("ok")
        await agent.drain()
        assert agent.sponge.interaction_count == count
        assert agent.sponge.opinion_vectors == {"tutoring": 0.4, "homework": -0.97}
        assert len(agent.sponge.staged_opinion_updates) == 2

    await agent.respond("ok")
    await agent.drain()
    sponge = agent.sponge
    assert sponge.interaction_count == 34
    assert sponge.staged_opinion_updates == []
    assert math.isclose(sponge.opinion_vectors["tutoring"], 0.4 + tutoring_delta, rel_tol=1e-12)
    assert sponge.opinion_vectors["homework"] == -1.0  # -0.97 - 0.033 clamped
    assert sponge.belief_meta["tutoring"].evidence_count == 4
    assert sponge.belief_meta["homework"].evidence_count == 2
    assert sponge.belief_meta["tutoring"].last_reinforced == 34
    assert await db.community(COMMUNITY).latest_state() == sponge
    assert llm.reflections == 0  # 4 interactions since the last reflection: too early


# --- insights consumed after a rollback -----------------------------------------------------

OLDER = "Weighs trials over anecdotes."
NEWER = "Concedes quickly when shown a mechanism."


async def say(agent: SonalityAgent, llm: ScriptedLLM, insight: str | None = None) -> None:
    """One message, learned; with `insight`, a strong argument that yields it."""
    if insight is not None:
        llm.ess.append(argument("supports", "tutoring"))
        llm.insight = insight
    await agent.respond("A randomised trial with 2,000 pupils." if insight else "ok")
    await agent.drain()


async def test_insights_consumed_after_a_rollback_can_be_recalled(
    agent: SonalityAgent, llm: ScriptedLLM, memory: RecordingMemory
) -> None:
    await say(agent, llm, insight=OLDER)  # v1: interaction 1, OLDER pending
    await say(agent, llm)  # v2: interaction 2
    await agent.reflect_now("moderator")  # v3: OLDER becomes a memory
    await agent.rollback(1, actor="mod-1")  # v4: OLDER pending again; (1, 2] hidden
    assert agent.sponge.pending_insights == [OLDER]
    assert agent.sponge.hidden_ranges == [(1, 2, 4)]  # created before v4, in (1, 2]

    await agent.reflect_now("moderator")  # v5: consumes OLDER again
    await agent.flush_episodes()
    assert agent.sponge.pending_insights == []
    recallable = [
        e
        for e in memory.by_id.values()
        if e.memory_type == SEMANTIC
        and not any(
            a < e.interaction <= b and e.version < v for a, b, v in agent.sponge.hidden_ranges
        )
    ]
    assert [e.summary for e in recallable] == [OLDER]


async def test_a_reflection_after_a_rollback_does_not_overwrite_earlier_insights(
    agent: SonalityAgent, llm: ScriptedLLM, memory: RecordingMemory
) -> None:
    await say(agent, llm, insight=OLDER)  # v1: interaction 1, OLDER pending
    await agent.reflect_now("moderator")  # v2: OLDER stored
    await say(agent, llm, insight=NEWER)  # v3: interaction 2, NEWER pending
    await agent.reflect_now("moderator")  # v4: NEWER stored
    await agent.rollback(1, actor="mod-1")  # v5: OLDER pending again, at interaction 2
    await agent.reflect_now("moderator")  # v6: OLDER stored again
    await agent.rollback(4, actor="mod-1")  # undo: back to the state that knew NEWER
    await agent.flush_episodes()

    semantic = [e for e in memory.writes if e.memory_type == SEMANTIC]
    assert [e.summary for e in semantic] == [OLDER, NEWER, OLDER]
    kept = {e.summary for e in memory.by_id.values() if e.memory_type == SEMANTIC}
    assert NEWER in kept
