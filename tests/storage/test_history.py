"""Versions stored as keyframes and patches: every version reads back exactly as committed."""

from __future__ import annotations

import asyncio
import json
import random
import threading
from pathlib import Path

import pytest

from sonality.llm import Usage
from sonality.state import SpongeState
from sonality.store import StateCommit, UsageRecord
from storage import Database, StorageError, VersionConflictError
from storage import community as community_module
from storage.history import MAX_CHAIN, merge_apply, merge_diff

from .conftest import Backend, record

CID = "discord:1"


def rows(where: Backend | Path, community_id: str = CID) -> list[tuple[int, int | None, str]]:
    """(version, keyframe, state_json) as stored, oldest first."""
    backend = where if isinstance(where, Backend) else Backend("sqlite", where, None)
    found = backend.sql(
        "SELECT version, keyframe, state_json FROM personality_versions "
        "WHERE community_id = ? ORDER BY version",
        (community_id,),
    )
    return [(int(str(v)), None if k is None else int(str(k)), str(s)) for v, k, s in found]


def chat(state: SpongeState, rng: random.Random) -> str:
    """What a plain chat message changes: counters only."""
    state.interaction_count += 1
    state.track_topic(rng.choice(["small_talk", "greetings", "weather"]))
    state.track_disagreement(rng.random() < 0.1)
    return "interaction"


def argue(state: SpongeState, rng: random.Random) -> str:
    """A strong argument: staged moves fall due, a new one is staged, an insight noted."""
    state.interaction_count += 1
    topic = f"topic_{rng.randrange(12)}"
    state.track_topic(topic)
    for line in state.apply_due_staged_updates():
        state.record_shift(line, 0.05)
    state.stage_opinion_update(
        topic, rng.choice([-1.0, 1.0]), rng.uniform(0.01, 0.2), 3, provenance=f"ESS: {topic}"
    )
    state.pending_insights.append(f"an insight about {topic}")
    return "interaction"


def reflect(state: SpongeState, rng: random.Random) -> str:
    state.decay_beliefs()
    state.pending_insights.clear()
    state.snapshot = f"I have thought about {rng.randrange(1000)} things. " + state.snapshot[:200]
    state.last_reflection_at = state.interaction_count
    return "reflection"


def copied(state: SpongeState) -> SpongeState:
    """A deep copy through pydantic's JSON (as the store keeps it): 5 times cheaper than
    `model_copy(deep=True)` on a large state, which cost these tests 12 s of CPU."""
    return SpongeState.model_validate_json(state.model_dump_json())


async def play(db: Database, seed: int, steps: int) -> dict[int, SpongeState]:
    """A scripted history of chat, arguments, reflections and rollbacks; returns each
    version's state as committed."""
    rng = random.Random(seed)
    store = db.community(CID)
    state = SpongeState()
    await store.commit(StateCommit(state=state, cause="seed", change="seed"))
    committed = {0: copied(state)}
    for _ in range(steps):
        roll = rng.random()
        if roll < 0.05 and len(committed) > 2:
            target = rng.randrange(len(committed))
            loaded = await store.state_at(target)
            assert loaded is not None
            loaded.interaction_count = state.interaction_count
            state, cause = loaded, "rollback"
        else:
            state = copied(state)
            step = chat if roll < 0.75 else argue if roll < 0.93 else reflect
            cause = step(state, rng)
        state.version = len(committed)
        await store.commit(StateCommit(state=state, cause=cause, change=cause))
        committed[state.version] = copied(state)
    return committed


@pytest.mark.parametrize("seed", [1, 2, 3])
async def test_every_version_reads_back_as_committed(
    db: Database, backend: Backend, seed: int
) -> None:
    committed = await play(db, seed, steps=300)
    stored = rows(backend)
    keyframes = [v for v, k, _ in stored if k is None]
    # Both kinds were written, and every rollback is a keyframe.
    assert 0 in keyframes and len(keyframes) < len(stored) / 3
    cold = db.community(CID)  # a store that never committed: it rebuilds everything
    for version, expected in committed.items():
        loaded = await cold.state_at(version)
        assert loaded == expected
        assert loaded is not None and loaded.model_dump_json() == expected.model_dump_json()
    assert await cold.latest_state() == committed[max(committed)]
    assert await cold.state_at(len(committed)) is None


async def test_many_versions_read_in_one_go_equal_each_read_alone(db: Database) -> None:
    committed = await play(db, seed=7, steps=200)
    store = db.community(CID)
    assert await store.states_at(committed) == committed
    rng = random.Random(8)
    some = [*rng.sample(sorted(committed), 25), -1, len(committed), len(committed) + 5]
    found = await store.states_at(some)
    assert found == {v: committed[v] for v in some if v in committed}
    # A span starting in the middle of a chain still starts from its keyframe.
    assert await store.states_at([len(committed) - 1]) == {
        len(committed) - 1: committed[len(committed) - 1]
    }
    assert await store.states_at([]) == {}
    assert await db.community("discord:none").states_at([0, 1]) == {}


async def test_many_versions_are_rebuilt_while_the_event_loop_runs(
    db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rebuilding a history view's states is CPU (a replay and a parse per version):
    it runs off the event loop, which other communities' replies need meanwhile. Each
    parse here waits for a callback of the loop's; on the loop it would wait in vain."""
    committed = await play(db, seed=9, steps=40)
    loop = asyncio.get_running_loop()
    parse = community_module._load_state
    ran: list[bool] = []

    def waiting_parse(text: str) -> SpongeState:
        ticked = threading.Event()
        loop.call_soon_threadsafe(ticked.set)
        ran.append(all(ran) and ticked.wait(5))  # after one in vain, fail fast
        return parse(text)

    monkeypatch.setattr(community_module, "_load_state", waiting_parse)
    assert await db.community(CID).states_at(committed) == committed
    assert ran and all(ran)


async def test_history_survives_reopen_and_goes_on_from_it(backend: Backend) -> None:
    first = await backend.open()
    committed = await play(first, seed=4, steps=80)
    await first.close()
    second = await backend.open()
    try:
        store = second.community(CID)
        state = await store.latest_state()
        assert state == committed[80]
        assert state is not None
        state.version = 81
        state.interaction_count += 1
        await store.commit(StateCommit(state=state, cause="interaction", change="after reopen"))
        assert rows(backend)[-1][1] is not None  # a patch against the loaded version
        assert await second.community(CID).state_at(81) == state
        for version in (0, 40, 80):
            assert await store.state_at(version) == committed[version]
    finally:
        await second.close()


def big_state(topics: int = 40) -> SpongeState:
    state = SpongeState()
    for n in range(topics):
        state.update_opinion(f"topic_{n}", 1.0, 0.3, provenance=f"ESS 0.8: a study on topic {n}")
        state.track_topic(f"topic_{n}")
    return state


async def test_a_chat_commit_stores_far_less_than_the_full_state(
    db: Database, backend: Backend
) -> None:
    store = db.community(CID)
    state = big_state()
    await store.commit(StateCommit(state=state, cause="seed", change="seed"))
    state = copied(state)
    state.version = 1
    chat(state, random.Random(0))
    await store.commit(StateCommit(state=state, cause="interaction", change="chat"))
    (_, _, full), (_, keyframe, patch) = rows(backend)
    assert keyframe == 0
    assert len(full) > 3000
    assert len(patch) * 20 < len(full)
    assert await store.state_at(1) == state


async def test_a_seed_and_a_rollback_are_keyframes(db: Database, backend: Backend) -> None:
    store = db.community(CID)
    state = big_state()
    await store.commit(StateCommit(state=state, cause="seed", change="seed"))
    for version, cause in ((1, "interaction"), (2, "rollback"), (3, "interaction")):
        state = copied(state)
        state.version = version
        state.interaction_count += 1
        await store.commit(StateCommit(state=state, cause=cause, change=cause))
    assert [k for _, k, _ in rows(backend)] == [None, 0, None, 2]


async def test_the_chain_is_cut_after_max_chain_patches(db: Database, backend: Backend) -> None:
    store = db.community(CID)
    state = big_state(150)  # so large that the size rule does not cut the chain first
    await store.commit(StateCommit(state=state, cause="seed", change="seed"))
    for version in range(1, MAX_CHAIN + 3):
        state = copied(state)
        state.version = version
        state.interaction_count += 1
        await store.commit(StateCommit(state=state, cause="interaction", change="tick"))
    keyframes = [v for v, k, _ in rows(backend) if k is None]
    assert keyframes == [0, MAX_CHAIN + 1]
    assert await db.community(CID).state_at(MAX_CHAIN) == (await store.state_at(MAX_CHAIN))
    assert (await db.community(CID).latest_state()) == state


async def test_a_store_that_did_not_commit_the_previous_version_writes_a_keyframe(
    db: Database, backend: Backend
) -> None:
    one, two = db.community(CID), db.community(CID)
    state = SpongeState()
    await one.commit(StateCommit(state=state, cause="seed", change="seed"))
    for version, writer in ((1, one), (2, two), (3, one), (4, one)):
        state = copied(state)
        state.version = version
        state.interaction_count += 1
        await writer.commit(StateCommit(state=state, cause="interaction", change="x"))
    # `two` never saw v1 and `one` never saw v2: both wrote keyframes, never a wrong patch.
    assert [k for _, k, _ in rows(backend)] == [None, 0, None, None, 3]
    stale = state.model_copy(update={"version": 4})
    with pytest.raises(VersionConflictError):
        await two.commit(StateCommit(state=stale, cause="interaction", change="late"))
    assert await two.latest_state() == state


async def test_a_commit_that_fails_midway_leaves_the_chain_as_it_was(
    db: Database, backend: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = db.community(CID)
    state = big_state()
    await store.commit(StateCommit(state=state, cause="seed", change="seed"))
    await store.record_interaction(record("i1"))
    nxt = copied(state)
    nxt.version = 1
    chat(nxt, random.Random(1))

    def crash(*args: object, **kwargs: object) -> None:
        raise RuntimeError("power cut")

    # Usage is written after the version row: the whole transaction must roll back.
    monkeypatch.setattr("storage.community.insert_usage", crash)
    failing = StateCommit(
        state=nxt,
        cause="interaction",
        change="chat",
        interaction_id="i1",
        usage=[UsageRecord(purpose="ess", model="m", usage=Usage(input_tokens=1))],
    )
    with pytest.raises(RuntimeError, match="power cut"):
        await store.commit(failing)
    assert len(rows(backend)) == 1
    assert await store.pending_count() == 1
    monkeypatch.undo()
    await store.commit(failing)
    assert [k for _, k, _ in rows(backend)] == [None, 0]
    assert await store.state_at(1) == nxt
    assert await store.pending_count() == 0


async def test_patch_rows_are_append_only_and_must_extend_their_chain(
    db: Database, backend: Backend
) -> None:
    await play(db, seed=5, steps=30)
    stored = rows(backend)
    patch_version = next(v for v, k, _ in stored if k is not None)
    refused = backend.integrity_error
    with pytest.raises(refused, match="append-only"):
        backend.run(
            "UPDATE personality_versions SET state_json = '{}' WHERE version = ?",
            (patch_version,),
        )
    with pytest.raises(refused, match="append-only"):
        backend.run("DELETE FROM personality_versions WHERE version = ?", (patch_version,))
    last = stored[-1][0]
    insert = (
        "INSERT INTO personality_versions (community_id, version, cause, change, "
        "interaction_count, state_json, keyframe, created_at) "
        "VALUES (?, ?, 'interaction', 'x', 0, '{}', ?, '2025-01-01')"
    )
    # A gap before the patch, and a keyframe that is not its predecessor's.
    with pytest.raises(refused, match="keyframe's chain"):
        backend.run(insert, (CID, last + 2, 0))
    with pytest.raises(refused, match="keyframe's chain"):
        backend.run(insert, (CID, last + 1, last - 1 if stored[-1][1] is None else last))
    assert rows(backend) == stored


async def test_a_broken_chain_is_reported_not_misread(db: Database, backend: Backend) -> None:
    await play(db, seed=6, steps=10)
    keyframe = rows(backend)[-1][1]
    assert keyframe is not None
    on_table = " ON personality_versions" if backend.postgres else ""
    backend.run("DROP TRIGGER personality_versions_no_delete" + on_table)
    backend.run("DELETE FROM personality_versions WHERE version = ?", (keyframe,))
    with pytest.raises(StorageError, match="no keyframe"):
        await db.community(CID).latest_state()


async def test_rows_written_before_the_migration_stay_keyframes(empty_backend: Backend) -> None:
    """A database from the release before patches: full rows, one with a legacy field."""
    backend = empty_backend
    old = SpongeState(version=0, snapshot="as it was")
    # A field older releases stored, first, as they wrote it.
    legacy = {"vibe": "cheerful", **SpongeState(version=1, interaction_count=1).model_dump()}
    await backend.migrate_to(3)
    backend.run(
        "INSERT INTO communities (id, platform, name, created_at) VALUES (?, 'discord', '', 'x')",
        (CID,),
    )
    for version, text in ((0, old.model_dump_json()), (1, json.dumps(legacy))):
        backend.run(
            "INSERT INTO personality_versions (community_id, version, cause, change, "
            "interaction_count, state_json, created_at) VALUES (?, ?, 'seed', '', ?, ?, 'x')",
            (CID, version, version, text),
        )
    db = await backend.open()
    try:
        store = db.community(CID)
        assert await store.state_at(0) == old
        latest = await store.latest_state()
        assert latest == SpongeState(version=1, interaction_count=1)
        assert latest is not None
        latest.version = 2
        latest.interaction_count = 2
        await store.commit(StateCommit(state=latest, cause="interaction", change="chat"))
        stored = rows(backend)
        assert [k for _, k, _ in stored] == [None, None, 1]
        assert '"vibe":null' in stored[2][2]  # the patch drops what the old row had
        assert await db.community(CID).state_at(2) == latest
    finally:
        await db.close()


def test_merge_patch_round_trips_nested_changes() -> None:
    old = {"a": 1, "b": {"x": 1, "y": [1, 2]}, "c": "keep", "gone": True}
    new = {"a": 1.0, "b": {"x": 1, "y": [1, 2, 3], "z": {"deep": 1}}, "c": "keep", "n": 0}
    patch = merge_diff(old, new)
    assert patch == {"a": 1.0, "b": {"y": [1, 2, 3], "z": {"deep": 1}}, "gone": None, "n": 0}
    assert merge_apply(dict(old, b=dict(old["b"])), patch) == new  # type: ignore[call-overload]
    assert merge_diff(new, new) == {}
