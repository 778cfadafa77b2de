"""Append-only personality versions and atomic commits."""

from __future__ import annotations

import pytest

from sonality.llm import Usage
from sonality.state import BeliefMeta, Shift, SpongeState, StagedOpinionUpdate
from sonality.store import AuditEvent, StateCommit, StateStore, UsageRecord
from storage import (
    Database,
    InteractionAlreadyDoneError,
    UnknownInteractionError,
    VersionConflictError,
)

from .conftest import Backend, at, commit_of, record


def rich_state(version: int) -> SpongeState:
    return SpongeState(
        version=version,
        interaction_count=42,
        snapshot="I think carefully about evidence.",
        opinion_vectors={"nuclear_energy": 0.62, "remote_work": -0.25},
        belief_meta={
            "nuclear_energy": BeliefMeta(
                confidence=0.7, evidence_count=3, last_reinforced=40, provenance="study"
            ),
            "remote_work": BeliefMeta(confidence=0.2, evidence_count=1, last_reinforced=12),
        },
        recent_shifts=[
            Shift(interaction=40, timestamp="2025-01-01T12:00:00Z", description="x", magnitude=0.1)
        ],
        pending_insights=["people like concrete numbers"],
        staged_opinion_updates=[
            StagedOpinionUpdate(
                topic="remote_work", signed_magnitude=-0.05, staged_at=41, due_interaction=44
            )
        ],
        last_reflection_at=40,
    )


async def test_state_round_trips_with_opinions_and_beliefs(db: Database) -> None:
    store = db.community("discord:1")
    _: StateStore = store  # mypy checks that CommunityStore satisfies the protocol
    assert await store.latest_state() is None
    assert await store.latest_version() is None
    original = rich_state(0)
    await store.commit(StateCommit(state=original, cause="seed", change="seed"))
    loaded = await store.latest_state()
    assert loaded == original
    assert loaded is not None and loaded.belief_meta["nuclear_energy"].provenance == "study"
    assert await store.state_at(0) == original
    assert await store.state_at(1) is None


async def test_first_version_must_be_zero_then_consecutive(db: Database) -> None:
    store = db.community("discord:1")
    with pytest.raises(VersionConflictError):
        await store.commit(commit_of(1))
    await store.commit(commit_of(0))
    for bad in (0, 2, 5):
        with pytest.raises(VersionConflictError):
            await store.commit(commit_of(bad))
    await store.commit(commit_of(1))
    assert await store.latest_version() == 1


async def test_rejected_commit_writes_nothing(db: Database) -> None:
    store = db.community("discord:1")
    await store.commit(commit_of(0))
    await store.record_interaction(record("i1"))
    usage_before = await db.usage_totals("discord:1")

    wrong = commit_of(
        7,
        interaction_id="i1",
        events=[AuditEvent(kind="ess", interaction=1, payload={"score": 0.9})],
        usage=[UsageRecord(purpose="ess", model="m", usage=Usage(input_tokens=100))],
    )
    with pytest.raises(VersionConflictError):
        await store.commit(wrong)

    assert await store.latest_version() == 0
    assert await store.audit_events() == []
    assert [r.id for r in await store.pending_interactions()] == ["i1"]
    assert await db.usage_totals("discord:1") == usage_before


async def test_commit_writes_version_events_usage_and_ack_together(db: Database) -> None:
    store = db.community("discord:1")
    await store.commit(commit_of(0))
    await store.record_interaction(record("i1"))
    await store.commit(
        commit_of(
            1,
            interaction_id="i1",
            events=[
                AuditEvent(kind="ess", interaction=1, payload={"score": 0.9, "topics": ["a"]}),
                AuditEvent(kind="reflection", interaction=1, payload={"ran": True}),
            ],
            usage=[UsageRecord(purpose="ess", model="m", usage=Usage(input_tokens=100))],
        )
    )
    assert await store.pending_interactions() == []
    events = await store.audit_events()
    assert [(e.kind, e.version) for e in events] == [("reflection", 1), ("ess", 1)]
    assert events[1].payload == {"score": 0.9, "topics": ["a"]}
    assert [e.kind for e in await store.audit_events(kind="ess")] == ["ess"]
    assert len(await store.audit_events(limit=1)) == 1
    totals = await db.usage_totals("discord:1")
    assert totals.by_role["evidence"].input_tokens == 100
    assert totals.input_tokens == 110  # + the reply usage written by record_interaction
    assert totals.calls == 2


async def test_commit_refuses_unknown_or_already_acked_interaction(db: Database) -> None:
    store = db.community("discord:1")
    await store.commit(commit_of(0))
    with pytest.raises(UnknownInteractionError):
        await store.commit(commit_of(1, interaction_id="never-recorded"))
    await store.record_interaction(record("i1"))
    await store.commit(commit_of(1, interaction_id="i1"))
    with pytest.raises(InteractionAlreadyDoneError):
        await store.commit(commit_of(2, interaction_id="i1"))
    assert await store.latest_version() == 1


async def test_versions_are_append_only(db: Database, backend: Backend) -> None:
    store = db.community("discord:1")
    first = rich_state(0)
    await store.commit(StateCommit(state=first, cause="seed", change="seed"))
    await store.commit(
        StateCommit(state=SpongeState(version=1), cause="rollback", change="r", actor="mod")
    )
    with pytest.raises(backend.integrity_error, match="append-only"):
        backend.run("UPDATE personality_versions SET change = 'edited'")
    with pytest.raises(backend.integrity_error, match="append-only"):
        backend.run("DELETE FROM personality_versions")
    assert await store.state_at(0) == first
    infos = await store.versions()
    assert [(v.version, v.cause, v.actor) for v in infos] == [
        (1, "rollback", "mod"),
        (0, "seed", None),
    ]
    assert infos[1].interaction_count == 42


async def test_versions_newest_first_with_paging(db: Database) -> None:
    store = db.community("discord:1")
    for v in range(6):
        await store.commit(commit_of(v))
    assert [v.version for v in await store.versions(limit=3)] == [5, 4, 3]
    assert [v.version for v in await store.versions(limit=3, before=3)] == [2, 1, 0]
    assert await store.versions(before=0) == []
    assert (await store.versions(limit=1))[0].change == "v5"


async def test_state_survives_reopen(backend: Backend) -> None:
    first = await backend.open()
    await first.community("slack:T1").commit(
        StateCommit(state=rich_state(0), cause="seed", change="s")
    )
    await first.close()
    second = await backend.open()
    try:
        assert await second.community("slack:T1").latest_state() == rich_state(0)
    finally:
        await second.close()


async def test_record_created_at_preserved(db: Database) -> None:
    store = db.community("discord:1")
    await store.record_interaction(record("i1", minutes=5))
    (pending,) = await store.pending_interactions()
    assert pending == record("i1", minutes=5)
    assert pending.created_at == at(5)


async def test_failure_midway_rolls_back_everything(db: Database) -> None:
    store = db.community("discord:1")
    await store.commit(commit_of(0))
    await store.record_interaction(record("i1"))
    unserialisable = commit_of(
        1,
        interaction_id="i1",
        events=[
            AuditEvent(kind="ess", interaction=1),
            AuditEvent(kind="bad", interaction=1, payload={"x": object()}),
        ],
    )
    with pytest.raises(Exception, match="serialize"):
        await store.commit(unserialisable)
    # The version row and the first event were already inserted when it failed.
    assert await store.latest_version() == 0
    assert await store.audit_events() == []
    assert await store.pending_count() == 1
    await store.commit(commit_of(1, interaction_id="i1"))  # the store is still usable
    assert await store.latest_version() == 1
