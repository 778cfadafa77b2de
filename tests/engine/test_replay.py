"""The replay behind forget-me (issue 11): a community's evidence log replayed without
one member gives, within 1e-9, the opinions of a fresh community that only ever heard
the other members' messages, with the same ESS results.

Both communities are real agents on the real SQLite store with a scripted LLM (see
tests/engine/test_agent_learning.py for why the engine is tested in-process). No
reflection is time- or count-triggered; decays come from moderator reflections after
the same remaining messages in both communities.
"""

from __future__ import annotations

import asyncio
import gc
import math
import random
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, cast

import pytest

import sonality.agent
import sonality.replay
from sonality.agent import MessageWords, SonalityAgent
from sonality.config import EngineConfig
from sonality.replay import (
    ReplayError,
    collection_paused,
    forgotten,
    release_in_slices,
    replay,
)
from sonality.rollback import rebase
from sonality.state import SpongeState
from sonality.store import Speaker
from storage import Database
from tests.engine.test_agent_learning import NO_ARGUMENT, RecordingMemory, ScriptedLLM

ALICE = Speaker(id="u-alice", name="Alice")
BOB = Speaker(id="u-bob", name="Bob")
CAROL = Speaker(id="u-carol", name="Carol")
TOPICS = ("nuclear_energy", "rent_control", "remote_work")


@pytest.fixture
async def db(tmp_path: Path) -> AsyncIterator[Database]:
    database = await Database.open(tmp_path / "bot.sqlite3")
    try:
        yield database
    finally:
        await database.close()


#: The seed's tunables, except that no reflection is triggered by count or shift (its
#: half-interval guard holds one back for 50,000 messages): decays come only from the
#: moderator reflections the script places, so both communities decay alike. Every
#: agent and replay here gets it, whatever the environment running the tests sets.
TUNABLES = EngineConfig(reflection_every=100_000)


def argument(
    direction: str, topics: tuple[str, ...], score: float, novelty: float
) -> dict[str, Any]:
    return {
        "score": score,
        "reasoning_type": "empirical_data",
        "source_reliability": "peer_reviewed",
        "internal_consistency": True,
        "novelty": novelty,
        "topics": list(topics),
        "summary": f"An argument that {direction} {', '.join(topics)}.",
        "opinion_direction": direction,
    }


def script(seed: int, length: int) -> list[tuple[Speaker, dict[str, Any] | None]]:
    """Alice argues for, Bob against, Carol chats; `None` marks a moderator reflection."""
    rng = random.Random(seed)
    steps: list[tuple[Speaker, dict[str, Any] | None]] = []
    for n in range(length):
        who = rng.choice((ALICE, ALICE, BOB, BOB, CAROL))
        if who is CAROL:
            steps.append((CAROL, dict(NO_ARGUMENT)))
        else:
            topics = tuple(rng.sample(TOPICS, rng.randint(1, 2)))
            direction = "supports" if who is ALICE else "opposes"
            steps.append(
                (who, argument(direction, topics, rng.uniform(0.35, 0.95), rng.uniform(0.0, 1.0)))
            )
        if n % 9 == 8:
            steps.append((CAROL, None))
    return steps


async def run(agent: SonalityAgent, llm: ScriptedLLM, steps: list[tuple[Speaker, Any]]) -> None:
    for n, (speaker, answer) in enumerate(steps):
        if answer is None:
            await agent.reflect_now("moderator", actor="mod")
            continue
        llm.ess.append(answer)
        await agent.respond(f"message {n}", speaker=speaker)
        await agent.drain()


@pytest.fixture
async def agents(db: Database) -> AsyncIterator[dict[str, tuple[SonalityAgent, ScriptedLLM]]]:
    made: dict[str, tuple[SonalityAgent, ScriptedLLM]] = {}
    for name in ("test:whole", "test:fresh"):
        llm = ScriptedLLM()
        made[name] = (
            await SonalityAgent.load(
                client=llm,
                store=db.community(name),
                episodes=RecordingMemory(),
                model="m",
                ess_model="m",
                config=TUNABLES,
            ),
            llm,
        )
    try:
        yield made
    finally:
        for agent, _ in made.values():
            await agent.close(grace_seconds=5)


def assert_same_opinions(replayed: SpongeState, expected: SpongeState) -> None:
    assert replayed.interaction_count == expected.interaction_count
    assert set(replayed.opinion_vectors) == set(expected.opinion_vectors)
    for topic, value in expected.opinion_vectors.items():
        assert math.isclose(replayed.opinion_vectors[topic], value, rel_tol=0, abs_tol=1e-9)
        mine, theirs = replayed.belief_meta[topic], expected.belief_meta[topic]
        assert (mine.evidence_count, mine.last_reinforced) == (
            theirs.evidence_count,
            theirs.last_reinforced,
        )
        assert math.isclose(mine.confidence, theirs.confidence, rel_tol=0, abs_tol=1e-9)
    assert [
        (u.topic, round(u.signed_magnitude, 12), u.due_interaction)
        for u in replayed.staged_opinion_updates
    ] == [
        (u.topic, round(u.signed_magnitude, 12), u.due_interaction)
        for u in expected.staged_opinion_updates
    ]


@pytest.mark.parametrize("seed", [1, 2, 3])
async def test_replaying_without_a_member_equals_a_community_that_never_heard_them(
    agents: dict[str, tuple[SonalityAgent, ScriptedLLM]],
    db: Database,
    seed: int,
) -> None:
    steps = script(seed, 45)
    whole, whole_llm = agents["test:whole"]
    fresh, fresh_llm = agents["test:fresh"]
    await run(whole, whole_llm, steps)
    await run(fresh, fresh_llm, [(who, answer) for who, answer in steps if who is not ALICE])

    log = await db.community("test:whole").evidence()
    # Replaying everyone reproduces the community exactly: the log is complete.
    assert_same_opinions(replay(log, config=TUNABLES), whole.sponge)
    without_alice = replay(log, without_members={ALICE.id}, config=TUNABLES)
    assert_same_opinions(without_alice, fresh.sponge)
    # The scenario is one where leaving Alice out matters (so the check above can fail).
    assert any(
        abs(without_alice.opinion_vectors.get(t, 0.0) - whole.sponge.opinion_vectors.get(t, 0.0))
        > 1e-3
        for t in TOPICS
    )
    # Decays happened, and the replay applied them at the recorded points.
    assert sum(s.kind == "decay" for s in log) >= 4
    # Her influence is gone from the provenance too.
    assert all(
        source.member != ALICE.id
        for meta in without_alice.belief_meta.values()
        for source in meta.moved_by
    )
    assert all(u.member != ALICE.id for u in without_alice.staged_opinion_updates)


@pytest.mark.parametrize("seed", [4, 5])
async def test_withdrawing_one_message_equals_a_community_that_never_heard_it(
    agents: dict[str, tuple[SonalityAgent, ScriptedLLM]],
    db: Database,
    seed: int,
) -> None:
    """A deleted message (issue 25): replayed without it, with decays on both sides."""
    steps = script(seed, 45)
    whole, whole_llm = agents["test:whole"]
    fresh, fresh_llm = agents["test:fresh"]
    spoken = [n for n, (who, answer) in enumerate(steps) if answer is not None]
    # An early argument of Alice's: its move committed long ago, and much came after.
    gone = next(n for n in spoken[3:] if steps[n][0] is ALICE)
    await run(whole, whole_llm, steps)
    await run(fresh, fresh_llm, [s for n, s in enumerate(steps) if n != gone])
    messages = [s for s in await db.community("test:whole").evidence() if s.kind == "message"]
    interaction_id = messages[spoken.index(gone)].interaction_id
    heard_all = whole.sponge.model_copy(deep=True)

    state = await whole.withdraw_message(interaction_id, actor="message-1", change="deleted")

    assert state is not None and whole.sponge == state and state.version == heard_all.version + 1
    assert_same_opinions(state, rebase(fresh.sponge, state.interaction_count))
    assert any(
        abs(state.opinion_vectors.get(t, 0.0) - heard_all.opinion_vectors.get(t, 0.0)) > 1e-6
        for t in TOPICS
    )
    assert all(u.interaction_id != interaction_id for u in state.staged_opinion_updates)
    # A message nothing was learned from: no version.
    assert await whole.withdraw_message("never-seen", actor="message-2", change="x") is None
    assert whole.sponge == state


async def test_a_rollback_in_the_log_keeps_the_undone_evidence_undone(
    agents: dict[str, tuple[SonalityAgent, ScriptedLLM]],
    db: Database,
) -> None:
    steps = script(7, 30)
    whole, whole_llm = agents["test:whole"]
    await run(whole, whole_llm, steps[:15])
    target = whole.sponge.version
    await run(whole, whole_llm, steps[15:25])
    await whole.rollback(target, actor="mod")
    await run(whole, whole_llm, steps[25:])

    log = await db.community("test:whole").evidence()
    assert_same_opinions(replay(log, config=TUNABLES), whole.sponge)


def test_a_rollback_to_a_state_the_log_never_reached_is_refused() -> None:
    from sonality.evidence import EvidenceStep

    bad = [EvidenceStep(kind="rollback", interaction=0, version=1, target_version=5)]
    with pytest.raises(ReplayError):
        replay(bad, config=TUNABLES)


async def test_a_forget_me_recomputes_every_derived_field_and_drops_their_own_topics(
    agents: dict[str, tuple[SonalityAgent, ScriptedLLM]],
) -> None:
    """Issue 22, finding 2: topic counts, the disagreement rate and the recent shifts are
    those of a community that never heard the member, and a topic only their messages
    produced leaves the state, the narrative and the change line."""
    own = "alicesecretword"
    steps = [
        (who, {**answer, "topics": [*answer["topics"], own]} if who is ALICE and answer else answer)
        for who, answer in script(4, 40)
    ]
    whole, whole_llm = agents["test:whole"]
    fresh, fresh_llm = agents["test:fresh"]
    await run(whole, whole_llm, steps)
    await run(fresh, fresh_llm, [(who, answer) for who, answer in steps if who is not ALICE])
    assert own in whole.sponge.behavioral_signature.topic_engagement  # so the check can fail
    whole.sponge.snapshot += f" Lately I keep coming back to {own}."

    state = await whole.forget_member(ALICE.id, actor="member-abc123")

    signature, expected = state.behavioral_signature, fresh.sponge.behavioral_signature
    assert signature.topic_engagement == expected.topic_engagement
    assert math.isclose(
        signature.disagreement_rate, expected.disagreement_rate, rel_tol=0, abs_tol=1e-12
    )
    assert [s.description for s in state.recent_shifts] == [
        s.description for s in fresh.sponge.recent_shifts
    ]
    assert own not in state.model_dump_json()
    [latest] = await whole.store.versions(limit=1)
    assert latest.cause == "forget-me" and own not in latest.change


async def test_a_deletion_replays_from_the_state_before_the_message_unless_a_replay_came_after(
    agents: dict[str, tuple[SonalityAgent, ScriptedLLM]],
    db: Database,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Posting and deleting must not cost a replay of the whole log: a message learned
    after the newest replayed version is taken back from the stored state before it,
    with the result of a whole replay. An older message (a deletion came after it, and
    the stored states since may still hold the deleted one's influence) replays all."""
    whole, llm = agents["test:whole"]
    store = whole.store
    asked: list[int] = []
    real_evidence = store.evidence
    # The bot erases a deleted message's evidence rows once its version is in
    # (`bot.deletion`, `storage.deletion.erase_message`): so does this view of the log.
    erased: set[str] = set()

    async def evidence(since_version: int = 0) -> list[Any]:
        asked.append(since_version)
        return [s for s in await real_evidence(since_version) if s.interaction_id not in erased]

    monkeypatch.setattr(store, "evidence", evidence)
    await run(whole, llm, script(11, 60))

    async def take_back(pick: int) -> tuple[int, SpongeState, SpongeState]:
        """Delete the `pick`th learned message; the state, and a whole replay's."""
        log = [s for s in await real_evidence() if s.interaction_id not in erased]
        messages = [s for s in log if s.kind == "message"]
        gone = messages[pick].interaction_id
        words = await db.message_words("test:whole", gone)
        expected, _ = forgotten(log, whole.sponge, (), (), words.topics, (gone,), config=TUNABLES)
        asked.clear()
        state = await whole.withdraw_message(
            gone, actor="message-x", change="deleted", drop_topics=words.topics
        )
        assert state is not None
        erased.add(gone)
        [since] = asked
        return since, state, expected

    def assert_same(state: SpongeState, expected: SpongeState, *, rate: bool = True) -> None:
        assert_same_opinions(state, expected)
        assert state.behavioral_signature.topic_engagement == (
            expected.behavioral_signature.topic_engagement
        )
        if rate:
            assert state.behavioral_signature == expected.behavioral_signature
        assert [(s.interaction, s.description) for s in state.recent_shifts] == [
            (s.interaction, s.description) for s in expected.recent_shifts
        ]

    late, state, expected = await take_back(-3)
    assert late > 1  # from the state before it, not the first message
    assert_same(state, expected)

    since, state, expected = await take_back(5)  # learned before that deletion
    assert since == 0
    assert_same(state, expected)

    await run(whole, llm, script(12, 20))
    since, state, expected = await take_back(-2)  # after both deletions again
    assert since > late
    # The disagreement rate is a running mean over the interaction count, which a
    # replay leaves at the live count: the live bot has weighed each message since the
    # first deletion by that count, and a replay from its stored state keeps those
    # weights, where a whole replay weighs by the messages left in the log.
    assert_same(state, expected, rate=False)


async def test_a_rollback_after_a_deleted_message_makes_its_deletion_replay_the_whole_log(
    agents: dict[str, tuple[SonalityAgent, ScriptedLLM]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The versions after a rollback hold a restored state, not one learned on from the
    version before: a message from before it cannot be taken back from a stored state,
    while one learned after it can. Two communities with the same history, one
    deletion each (a deletion is itself such a version)."""
    steps = script(5, 40)
    asked: list[int] = []
    rolled_back = 0
    for name in ("test:whole", "test:fresh"):
        agent, llm = agents[name]
        real_evidence = agent.store.evidence

        async def evidence(since_version: int = 0, real: Any = real_evidence) -> list[Any]:
            asked.append(since_version)
            return cast(list[Any], await real(since_version))

        monkeypatch.setattr(agent.store, "evidence", evidence)
        await run(agent, llm, steps[:20])
        target = agent.sponge.version
        await run(agent, llm, steps[20:30])
        await agent.rollback(target, actor="mod")
        rolled_back = agent.sponge.version
        await run(agent, llm, steps[30:])
    whole, fresh = agents["test:whole"][0], agents["test:fresh"][0]
    after = [s for s in await whole.store.evidence() if s.kind == "message"][-1]
    before = [s for s in await fresh.store.evidence() if s.kind == "message"][25]
    asked.clear()
    assert await whole.withdraw_message(after.interaction_id, actor="a", change="x")
    assert await fresh.withdraw_message(before.interaction_id, actor="b", change="y")
    assert asked == [asked[0], 0] and asked[0] > rolled_back


async def busy_while(agent: SonalityAgent, calls: list[Any]) -> list[Any]:
    """Start `calls` (coroutines) while another change holds the agent, as a replay
    would, and let them all wait for it; their results or errors once it lets go."""
    async with agent._changing():
        tasks = [asyncio.create_task(c) for c in calls]
        await asyncio.sleep(0)  # each runs up to its wait for the agent
        assert len(agent._withdrawals) == len(calls)
    return await asyncio.gather(*tasks, return_exceptions=True)


@pytest.mark.parametrize("seed", [4, 6])
async def test_messages_withdrawn_while_the_agent_is_busy_are_taken_back_in_one_replay(
    agents: dict[str, tuple[SonalityAgent, ScriptedLLM]],
    db: Database,
    monkeypatch: pytest.MonkeyPatch,
    seed: int,
) -> None:
    """A bulk delete, or a member deleting their history: one replay of the log and one
    version for all the messages, equal to a community that never heard any of them."""
    steps = script(seed, 45)
    whole, whole_llm = agents["test:whole"]
    fresh, fresh_llm = agents["test:fresh"]
    spoken = [n for n, (_, answer) in enumerate(steps) if answer is not None]
    gone = [*[n for n in spoken[3:] if steps[n][0] is ALICE][:2], spoken[-5]]
    await run(whole, whole_llm, steps)
    await run(fresh, fresh_llm, [s for n, s in enumerate(steps) if n not in gone])
    messages = [s for s in await db.community("test:whole").evidence() if s.kind == "message"]
    ids = [messages[spoken.index(n)].interaction_id for n in gone]
    before = whole.sponge.version
    reads: list[int] = []
    real_evidence = whole.store.evidence

    async def evidence(since_version: int = 0) -> list[Any]:
        reads.append(since_version)
        return cast(list[Any], await real_evidence(since_version))

    monkeypatch.setattr(whole.store, "evidence", evidence)

    def topics_of(interaction_id: str) -> MessageWords:
        async def words() -> tuple[list[str], list[str]]:
            return [], list((await db.message_words("test:whole", interaction_id)).topics)

        return words

    labels = [f"message-{n}" for n in range(len(ids))]
    calls = [
        whole.withdraw_message(i, actor=label, change="deleted", words=topics_of(i))
        for i, label in zip(ids, labels, strict=True)
    ]
    calls.append(whole.withdraw_message("never-seen", actor="message-x", change="deleted"))
    *states, nothing = await busy_while(whole, calls)

    assert nothing is None  # nothing was learned from it: no version of its own
    [state] = {id(s): s for s in states}.values()  # the same version for all three
    assert isinstance(state, SpongeState) and state.version == before + 1 == whole.sponge.version
    # One read of the log: from the version that learned the earliest of them.
    assert reads == [min([await whole.store.learned_at(i) or 0 for i in ids])] and reads[0] > 1
    assert_same_opinions(state, rebase(fresh.sponge, state.interaction_count))
    [version] = await db.community("test:whole").versions(limit=1)
    assert version.cause == "message-deleted"
    assert version.actor == ", ".join(labels)
    assert version.change.startswith("deleted (and 2 more taken back in the same replay)")


async def test_messages_withdrawn_just_after_a_replay_wait_out_its_pause_and_share_one(
    agents: dict[str, tuple[SonalityAgent, ScriptedLLM]],
    db: Database,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A member deleting old messages one at a time, each just as the last replay ends:
    no replay starts until a pause after the last one has passed (three times its
    length; a fixed second here), neither one withdrawn during that replay nor one
    withdrawn in the pause, and those withdrawn meanwhile are taken back in one."""
    monkeypatch.setattr(sonality.agent, "WITHDRAWAL_PAUSE_FACTOR", 1e9)
    monkeypatch.setattr(sonality.agent, "WITHDRAWAL_PAUSE_LIMIT", 1.0)
    whole, llm = agents["test:whole"]
    await run(whole, llm, script(5, 40))
    messages = [s for s in await db.community("test:whole").evidence() if s.kind == "message"]
    ids = [m.interaction_id for m in messages[4:10:2]]
    replays: list[tuple[float, float]] = []
    held = asyncio.Event()
    real = whole._withdraw_together

    async def timed(batch: Any) -> None:
        start = time.monotonic()
        if not replays:
            await held.wait()
        await real(batch)
        replays.append((start, time.monotonic()))

    monkeypatch.setattr(whole, "_withdraw_together", timed)
    before = whole.sponge.version

    def withdraw(n: int) -> asyncio.Task[SpongeState | None]:
        return asyncio.create_task(
            whole.withdraw_message(ids[n], actor=f"message-{n}", change="deleted")
        )

    first = withdraw(0)
    await asyncio.sleep(sonality.agent.WITHDRAWAL_GATHER_SECONDS + 0.05)
    during = withdraw(1)  # while the first replay runs
    await asyncio.sleep(0.05)
    held.set()
    state = await first
    after = withdraw(2)  # in the pause after it
    second, third = await asyncio.gather(during, after)

    assert state is not None and state.version == before + 1
    assert second is third and second is not None and second.version == before + 2
    assert len(replays) == 2 and replays[1][0] - replays[0][1] >= 1.0
    [version] = await db.community("test:whole").versions(limit=1)
    assert version.actor == "message-1, message-2"


async def withdraw_apart(
    agent: SonalityAgent, ids: list[str], gap: float
) -> list[SpongeState | None]:
    """Withdraw each of `ids` (labelled message-0, message-1, …) `gap` seconds after the
    one before, without waiting for any to finish; their results."""
    tasks = []
    for n, interaction_id in enumerate(ids):
        tasks.append(
            asyncio.create_task(
                agent.withdraw_message(interaction_id, actor=f"message-{n}", change="deleted")
            )
        )
        await asyncio.sleep(gap)
    return await asyncio.gather(*tasks)


async def test_messages_withdrawn_moments_apart_on_an_idle_agent_share_one_replay(
    agents: dict[str, tuple[SonalityAgent, ScriptedLLM]],
    db: Database,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A bulk delete's messages reach the agent one journal row after another: with the
    agent idle, the first waits until none has come for a moment, so all go together
    rather than the first alone and the rest after it."""
    monkeypatch.setattr(sonality.agent, "WITHDRAWAL_GATHER_SECONDS", 0.5)
    whole, llm = agents["test:whole"]
    await run(whole, llm, script(3, 40))
    messages = [s for s in await db.community("test:whole").evidence() if s.kind == "message"]
    before = whole.sponge.version
    states = await withdraw_apart(whole, [m.interaction_id for m in messages[4:10:2]], 0.1)
    assert states[0] is not None and all(s is states[0] for s in states)
    assert states[0].version == before + 1 == whole.sponge.version
    [version] = await db.community("test:whole").versions(limit=1)
    assert version.actor == "message-0, message-1, message-2"


async def test_a_member_deleting_faster_than_the_gathering_time_cannot_put_off_the_replay(
    agents: dict[str, tuple[SonalityAgent, ScriptedLLM]],
    db: Database,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each withdrawal restarts the gathering time, but only up to its limit after the
    first: messages withdrawn every 0.1 s with a gathering time of 0.3 s and a limit
    of 0.5 s are not all held for one replay until the last arrives."""
    monkeypatch.setattr(sonality.agent, "WITHDRAWAL_GATHER_SECONDS", 0.3)
    monkeypatch.setattr(sonality.agent, "WITHDRAWAL_GATHER_LIMIT", 0.5)
    monkeypatch.setattr(sonality.agent, "WITHDRAWAL_PAUSE_FACTOR", 0.0)
    whole, llm = agents["test:whole"]
    await run(whole, llm, script(7, 40))
    messages = [s for s in await db.community("test:whole").evidence() if s.kind == "message"]
    replays: list[float] = []
    real = whole._withdraw_together

    async def timed(batch: Any) -> None:
        replays.append(time.monotonic())
        await real(batch)

    monkeypatch.setattr(whole, "_withdraw_together", timed)
    started = time.monotonic()
    states = await withdraw_apart(whole, [m.interaction_id for m in messages[2:32:3]], 0.1)
    assert all(s is not None for s in states)
    # Ten withdrawals over a second: the first replay came at the limit, not after the last.
    assert len(replays) >= 2 and replays[0] - started < 0.9


@pytest.mark.parametrize("where", ["this process", "another process"])
async def test_a_deletion_before_the_forget_me_is_erased_keeps_the_member_forgotten(
    agents: dict[str, tuple[SonalityAgent, ScriptedLLM]], db: Database, where: str
) -> None:
    """The host erases a forgotten member's (or a deleted message's) log rows only once
    the replay's version is in, so a deletion can replay the log while they are still
    there: it must leave them out, and still learn what the member said since. In
    another process (scale-out on one database) only the forget-me's journal row says
    so."""
    steps = script(9, 40)
    whole, whole_llm = agents["test:whole"]
    fresh, fresh_llm = agents["test:fresh"]
    before = steps[:30]
    elsewhere = where == "another process"
    # While her forget-me's journal row is open, her new messages are not recorded.
    after = [s for s in steps[30:] if not (elsewhere and s[0] is ALICE)]
    await run(whole, whole_llm, before)
    if elsewhere:
        request = await db.begin_forget("test:whole", ALICE.id, "mod", "", datetime.now(UTC))
    forgot = await whole.forget_member(ALICE.id, actor="member-1")
    if elsewhere:
        await db.set_forget_version(request.id, forgot.version)
    await run(whole, whole_llm, after)
    if elsewhere:  # a process that did not run the forget-me takes the message back
        whole = await SonalityAgent.load(
            client=whole_llm,
            store=db.community("test:whole"),
            episodes=RecordingMemory(),
            model="m",
            ess_model="m",
            config=TUNABLES,
        )
    else:
        assert any(who is ALICE and answer is not None for who, answer in after)
    learned = [n for n, (_, answer) in enumerate(before + after) if answer is not None]
    messages = [s for s in await db.community("test:whole").evidence() if s.kind == "message"]
    assert len(messages) == len(learned)  # her rows are still in the log: not erased here
    # One of Bob's from before the forget-me: its deletion replays the whole log.
    gone = next(n for n in learned[len(learned) // 3 :] if steps[n][0] is BOB and n < 30)

    try:
        state = await whole.withdraw_message(
            messages[learned.index(gone)].interaction_id, actor="message-1", change="deleted"
        )
    finally:
        if elsewhere:
            await whole.close(grace_seconds=5)

    heard = [s for n, s in enumerate(before) if s[0] is not ALICE and n != gone]
    await run(fresh, fresh_llm, heard + after)
    assert state is not None
    assert_same_opinions(state, rebase(fresh.sponge, state.interaction_count))


async def test_a_failed_joint_replay_leaves_the_other_messages_to_their_own_calls(
    agents: dict[str, tuple[SonalityAgent, ScriptedLLM]],
    db: Database,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The call that ran the replay gets its error (its deletion stays journaled, to be
    finished on the next start); the messages it was taking back with it are not lost."""
    whole, llm = agents["test:whole"]
    await run(whole, llm, script(8, 30))
    messages = [s for s in await db.community("test:whole").evidence() if s.kind == "message"]
    first, second = messages[-4].interaction_id, messages[-2].interaction_id
    real_evidence = whole.store.evidence
    failures = [RuntimeError("the database went away")]

    async def evidence(since_version: int = 0) -> list[Any]:
        if failures:
            raise failures.pop()
        return cast(list[Any], await real_evidence(since_version))

    monkeypatch.setattr(whole.store, "evidence", evidence)
    before = whole.sponge.version
    results = await busy_while(
        whole,
        [
            whole.withdraw_message(first, actor="message-1", change="deleted"),
            whole.withdraw_message(second, actor="message-2", change="deleted"),
        ],
    )
    [error] = [r for r in results if isinstance(r, BaseException)]
    [state] = [r for r in results if isinstance(r, SpongeState)]
    assert str(error) == "the database went away"
    assert state.version == before + 1
    [version] = await db.community("test:whole").versions(limit=1)
    assert version.actor in ("message-1", "message-2")  # only the one that was not lost


def test_the_collector_pause_is_shared_and_ends_with_the_last_one_out() -> None:
    """Two replays at once (two communities forgetting) share one pause: the first to
    finish must not turn the collector back on under the other."""
    assert gc.isenabled()
    first, second = collection_paused(), collection_paused()
    first.__enter__()
    second.__enter__()
    assert not gc.isenabled()
    first.__exit__(None, None, None)
    assert not gc.isenabled()
    second.__exit__(None, None, None)
    assert gc.isenabled()


def test_a_replay_does_not_join_a_pause_older_than_the_limit(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Replays overlapping without end (members deleting messages in several communities
    in turn) must not keep the collector off for good: once a pause is older than
    `MAX_PAUSE_SECONDS`, a replay coming in does not extend it."""
    monkeypatch.setattr(sonality.replay, "MAX_PAUSE_SECONDS", 0.0)
    first = collection_paused()
    first.__enter__()
    assert not gc.isenabled()
    time.sleep(0.01)
    with collection_paused():
        first.__exit__(None, None, None)
        assert gc.isenabled()  # the late one did not hold the first pause open
    assert gc.isenabled()
    with collection_paused():  # a new pause starts once the old one is over
        assert not gc.isenabled()
    assert gc.isenabled()


def test_the_collector_pause_leaves_a_collector_someone_turned_off_off() -> None:
    gc.disable()
    try:
        with pytest.raises(ReplayError), collection_paused():
            raise ReplayError("a log that does not replay")
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_a_released_log_is_emptied_whatever_its_length() -> None:
    for length in (0, 1, 1023, 1024, 1025, 5000):
        items = [object() for _ in range(length)]
        release_in_slices(items, size=1024)
        assert items == []
