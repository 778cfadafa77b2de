"""Two communities in one file never see (or touch) each other's rows."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from sonality.llm import Usage
from sonality.store import AuditEvent, UsageRecord
from storage import Database, UnknownInteractionError

from .conftest import at, commit_of, record

A, B = "discord:1", "slack:T1"


async def test_every_table_is_scoped_by_community(db: Database) -> None:
    a, b = db.community(A), db.community(B)
    await a.commit(commit_of(0))
    await a.commit(commit_of(1))
    # B starts at 0 although A is at 1: versions are per community.
    await b.commit(commit_of(0))
    assert await a.latest_version() == 1
    assert await b.latest_version() == 0
    assert [v.version for v in await b.versions()] == [0]
    assert await b.state_at(1) is None

    # The same interaction id in both communities are two different outbox rows.
    await a.record_interaction(record("same-id", "for A"))
    await b.record_interaction(record("same-id", "for B"))
    await a.commit(
        commit_of(
            2,
            interaction_id="same-id",
            events=[AuditEvent(kind="ess", interaction=2)],
            usage=[UsageRecord(purpose="ess", model="m", usage=Usage(input_tokens=50))],
        )
    )
    assert await a.pending_interactions() == []
    assert [r.message for r in await b.pending_interactions()] == ["for B"]
    with pytest.raises(UnknownInteractionError):
        await b.commit(commit_of(1, interaction_id="only-in-A"))
    await a.record_interaction(record("only-in-A"))
    with pytest.raises(UnknownInteractionError):
        await b.mark_interaction_failed("only-in-A", "x")
    assert await a.pending_count() == 1

    assert [e.kind for e in await a.audit_events()] == ["ess"]
    assert await b.audit_events() == []

    assert (await db.usage_totals(A)).input_tokens == 10 + 50 + 10
    assert (await db.usage_totals(B)).input_tokens == 10

    await db.record_moderator_action(
        A, actor_id="m", actor_name="M", action="reflect", allowed=True
    )
    assert await db.moderator_actions(B) == []
    assert len(await db.moderator_actions(A)) == 1

    await db.append_exchange(A, "u1", "hello A", "hi A", at(0))
    await db.append_exchange(B, "u1", "hello B", "hi B", at(0))
    assert await db.recent_turns(A, "u1", 10, 10_000) == [
        ("user", "hello A"),
        ("assistant", "hi A"),
    ]
    assert await db.recent_turns(B, "u1", 10, 10_000) == [
        ("user", "hello B"),
        ("assistant", "hi B"),
    ]

    # Commits note activity at wall-clock time; reflect A after all of it.
    now = datetime.now(UTC) + timedelta(seconds=1)
    await db.mark_reflected(A, now)
    assert await db.communities_needing_nightly() == [B]
