"""Retention: each rule with a controllable clock (old rows go, recent and pending stay)."""

from __future__ import annotations

from datetime import timedelta

import pytest

from sonality.llm import Usage
from sonality.store import AuditEvent, UsageRecord
from storage import Database, RetentionPolicy
from storage import retention as retention_module

from .conftest import T0, Backend, at, commit_of, record

CID = "discord:1"
POLICY = RetentionPolicy(message_days=90, audit_days=365)
DAY = 24 * 60  # minutes


def interactions(backend: Backend) -> dict[str, tuple[object, ...]]:
    """id -> (status, speaker_name, message, reply, last_error) as stored."""
    found = backend.sql(
        "SELECT id, status, speaker_name, message, reply, last_error FROM interactions ORDER BY seq"
    )
    return {str(r[0]): (r[1], r[2], r[3], r[4], r[5]) for r in found}


async def finished(db: Database, interaction_id: str, minutes: float, version: int) -> None:
    """Record an interaction at `minutes` and acknowledge it with version `version`."""
    store = db.community(CID)
    await store.record_interaction(record(interaction_id, f"words of {interaction_id}", minutes))
    await store.commit(commit_of(version, interaction_id=interaction_id))


async def test_message_text_is_erased_after_message_retention_and_rows_after_audit(
    db: Database, backend: Backend
) -> None:
    store = db.community(CID)
    await store.commit(commit_of(0))
    await finished(db, "ancient", -400 * DAY, 1)  # past both retentions
    await finished(db, "old", -100 * DAY, 2)  # past the message retention only
    await finished(db, "recent", -10 * DAY, 3)
    await store.record_interaction(record("failed", "poison", -100 * DAY))
    for _ in range(3):
        await store.mark_interaction_failed("failed", "ValueError('poison')")
    await store.record_interaction(record("waiting", "still to learn", -400 * DAY))

    report = await db.apply_retention(T0, POLICY)

    assert (report.interactions, report.texts_erased) == (1, 2)
    rows = interactions(backend)
    assert "ancient" not in rows
    assert rows["old"] == ("done", "Ada", "", "", None)
    assert rows["failed"] == ("failed", "Ada", "", "", None)
    assert rows["recent"] == ("done", "Ada", "words of recent", "reply to words of recent", None)
    # Pending work is never touched, however old: it is still to be learned.
    (pending,) = await store.pending_interactions()
    assert (pending.id, pending.message) == ("waiting", "still to learn")
    # The names the audit trail refers to are still there; the versions all are.
    assert await db.speaker_names(CID, ["u1"]) == {"u1": "Ada"}
    assert [v.version for v in await store.versions()] == [3, 2, 1, 0]
    assert await store.state_at(1) is not None
    # A second run finds nothing more to do.
    assert (await db.apply_retention(T0, POLICY)).total == 0


async def test_audit_events_moderator_actions_and_usage_go_after_audit_retention(
    db: Database,
) -> None:
    store = db.community(CID)
    await store.commit(
        commit_of(
            0,
            events=[
                AuditEvent(kind="ess", interaction=1, created_at=at(-366 * DAY)),
                AuditEvent(kind="reflection", interaction=2, created_at=at(-364 * DAY)),
            ],
            usage=[
                UsageRecord(
                    purpose="ess", model="m", usage=Usage(input_tokens=7), created_at=at(when)
                )
                for when in (-367 * DAY, -2 * DAY)
            ],
        )
    )
    for when, action in ((-400 * DAY, "rollback"), (-30 * DAY, "reflect")):
        await db.record_moderator_action(
            CID, actor_id="m1", actor_name="Mod", action=action, allowed=True, at=at(when)
        )

    report = await db.apply_retention(T0, POLICY)

    assert (report.audit_events, report.moderator_actions, report.usage_days) == (1, 1, 1)
    assert [e.kind for e in await store.audit_events()] == ["reflection"]
    assert [a.action for a in await db.moderator_actions(CID)] == ["reflect"]
    assert [d.day for d in await db.usage_days(CID)] == [(T0 - timedelta(days=2)).date()]
    assert await store.latest_version() == 0  # versions are history: never pruned


async def test_expired_event_ids_and_oauth_states_go(db: Database) -> None:
    assert await db.mark_event_seen("slack", "Ev-old", at(-DAY - 1), ttl_seconds=86400)
    assert await db.mark_event_seen("slack", "Ev-new", at(-60), ttl_seconds=86400)
    await db.issue_oauth_state("expired", at(-1))
    await db.issue_oauth_state("valid", at(10))

    report = await db.apply_retention(T0, POLICY)

    assert (report.seen_events, report.oauth_states) == (1, 1)
    assert not await db.mark_event_seen("slack", "Ev-new", T0, ttl_seconds=86400)
    assert await db.consume_oauth_state("valid", T0)


async def test_retention_works_through_many_windows(
    db: Database, backend: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(retention_module, "WINDOW", 3)
    store = db.community(CID)
    await store.commit(commit_of(0))
    for n in range(1, 11):
        await finished(db, f"i{n}", (-100 if n % 2 else -1) * DAY, n)
    report = await db.apply_retention(T0, POLICY)
    assert report.texts_erased == 5
    erased = sorted(i for i, row in interactions(backend).items() if row[2] == "")
    assert erased == sorted(f"i{n}" for n in range(1, 11, 2))


async def test_the_cutoffs_follow_the_policy(db: Database, backend: Backend) -> None:
    store = db.community(CID)
    await store.commit(commit_of(0))
    await finished(db, "a", -8 * DAY, 1)
    await finished(db, "b", -6 * DAY, 2)
    report = await db.apply_retention(T0, RetentionPolicy(message_days=7, audit_days=30))
    assert report.texts_erased == 1
    assert interactions(backend)["a"][2] == "" and interactions(backend)["b"][2] != ""
    # 23 days on, "a" is 31 days old and goes; "b" (29 days) stays.
    report = await db.apply_retention(T0 + timedelta(days=23), RetentionPolicy(audit_days=30))
    assert (report.interactions, report.texts_erased) == (1, 0)
    assert list(interactions(backend)) == ["b"]
