"""The interaction outbox: durable before the reply, acked exactly once by a commit."""

from __future__ import annotations

import pytest

from sonality.llm import Usage
from sonality.store import UsageRecord
from storage import MAX_INTERACTION_ATTEMPTS, Database, UnknownInteractionError

from .conftest import Backend, commit_of, record


async def test_pending_until_committed_and_across_restart(backend: Backend) -> None:
    db = await backend.open()
    store = db.community("discord:1")
    await store.commit(commit_of(0))
    # Recorded later but with an earlier timestamp: order is recording order (seq).
    await store.record_interaction(record("a", "first", minutes=10))
    await store.record_interaction(record("b", "second", minutes=0))
    await store.record_interaction(record("c", "third", minutes=20))
    assert [r.id for r in await store.pending_interactions()] == ["a", "b", "c"]
    assert await store.pending_count() == 3

    await store.commit(commit_of(1, interaction_id="a"))
    await db.close()  # the process "restarts" here

    db = await backend.open()
    try:
        store = db.community("discord:1")
        pending = await store.pending_interactions()
        assert [r.id for r in pending] == ["b", "c"]
        assert pending[0].message == "second"
        assert pending[0].speaker.name == "Ada"
        assert pending[0].reply_usage.input_tokens == 10
        assert await store.pending_count() == 2
    finally:
        await db.close()


async def test_recording_twice_is_a_no_op(db: Database) -> None:
    store = db.community("discord:1")
    await store.record_interaction(record("a", "first"))
    await store.record_interaction(record("a", "changed"))
    pending = await store.pending_interactions()
    assert [(r.id, r.message) for r in pending] == [("a", "first")]
    totals = await db.usage_totals("discord:1")
    assert totals.calls == 1
    assert totals.by_role["reply"].input_tokens == 10
    assert totals.cache_read_tokens == 2


async def test_a_failed_attempt_still_counts_its_tokens(db: Database) -> None:
    store = db.community("discord:1")
    await store.record_interaction(record("a"))
    spent = UsageRecord(purpose="ess", model="m", usage=Usage(input_tokens=300, output_tokens=40))
    assert await store.mark_interaction_failed("a", "commit failed", [spent]) == 1
    totals = await db.usage_totals("discord:1")
    assert totals.by_role["evidence"].input_tokens == 300
    assert totals.by_role["evidence"].output_tokens == 40
    with pytest.raises(UnknownInteractionError):  # and an unknown id records nothing
        await store.mark_interaction_failed("nope", "err", [spent])
    assert (await db.usage_totals("discord:1")).by_role["evidence"].input_tokens == 300


async def test_failures_count_up_then_park_the_interaction(db: Database) -> None:
    store = db.community("discord:1")
    await store.record_interaction(record("poison"))
    await store.record_interaction(record("fine"))
    for attempt in range(1, MAX_INTERACTION_ATTEMPTS):
        assert await store.mark_interaction_failed("poison", f"boom {attempt}") == attempt
        assert [r.id for r in await store.pending_interactions()] == ["poison", "fine"]
    assert await store.mark_interaction_failed("poison", "boom") == MAX_INTERACTION_ATTEMPTS
    assert [r.id for r in await store.pending_interactions()] == ["fine"]
    # Further reports don't resurrect or count a parked row.
    assert await store.mark_interaction_failed("poison", "again") == MAX_INTERACTION_ATTEMPTS
    assert await store.pending_count() == 1
    row = await db._fetchone(
        "SELECT status, attempts, last_error FROM interactions WHERE id = 'poison'"
    )
    assert row == ("failed", MAX_INTERACTION_ATTEMPTS, "boom")


async def test_failure_of_unknown_interaction_raises(db: Database) -> None:
    with pytest.raises(UnknownInteractionError):
        await db.community("discord:1").mark_interaction_failed("nope", "err")


async def test_commit_after_a_failed_attempt_acks(db: Database) -> None:
    store = db.community("discord:1")
    await store.commit(commit_of(0))
    await store.record_interaction(record("a"))
    assert await store.mark_interaction_failed("a", "transient") == 1
    await store.commit(commit_of(1, interaction_id="a"))
    assert await store.pending_interactions() == []
    # A done row is not counted as failing any more.
    assert await store.mark_interaction_failed("a", "late report") == 1
