"""Event dedup, installations and OAuth state."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import pytest

from storage import Database, StorageError

from .conftest import T0, Backend, at


async def test_event_seen_once_also_after_restart(backend: Backend) -> None:
    db = await backend.open()
    assert await db.mark_event_seen("slack", "Ev1", at(0), ttl_seconds=3600) is True
    assert await db.mark_event_seen("slack", "Ev1", at(1), ttl_seconds=3600) is False
    assert await db.mark_event_seen("discord", "Ev1", at(1), ttl_seconds=3600) is True
    await db.close()
    db = await backend.open()
    try:
        assert await db.mark_event_seen("slack", "Ev1", at(2), ttl_seconds=3600) is False
    finally:
        await db.close()


async def test_event_expires_after_ttl(db: Database) -> None:
    assert await db.mark_event_seen("slack", "Ev1", at(0), ttl_seconds=60) is True
    assert await db.mark_event_seen("slack", "Ev1", at(0.5), ttl_seconds=60) is False
    assert await db.mark_event_seen("slack", "Other", at(2), ttl_seconds=60) is True
    row = await db._fetchone("SELECT COUNT(*) FROM seen_events WHERE event_id = 'Ev1'")
    assert row == (0,)  # pruned on the way
    assert await db.mark_event_seen("slack", "Ev1", at(2), ttl_seconds=60) is True


async def test_concurrent_deliveries_get_one_true(db: Database) -> None:
    results = await asyncio.gather(
        *(db.mark_event_seen("slack", "Ev", at(0), ttl_seconds=60) for _ in range(10))
    )
    assert sorted(results) == [False] * 9 + [True]


async def test_installation_save_find_delete(db: Database) -> None:
    key = {"enterprise_id": None, "team_id": "T1", "user_id": "U1", "is_enterprise_install": False}
    assert await db.find_installation(None, "T1") is None
    await db.save_installation(key, {"bot_token": "xoxb-1", "installed_at": T0})
    await db.save_installation({**key, "user_id": "U2"}, {"bot_token": "xoxb-2"})
    await db.save_installation({**key, "team_id": "T2"}, {"bot_token": "other-team"})

    latest = await db.find_installation(None, "T1")
    assert latest == {"bot_token": "xoxb-2"}
    first = await db.find_installation(None, "T1", user_id="U1")
    assert first is not None and first["bot_token"] == "xoxb-1"
    assert first["installed_at"] == T0.isoformat().replace("+00:00", "Z")

    # Re-installing by U1 replaces its row and becomes the latest.
    await db.save_installation(key, {"bot_token": "xoxb-3"})
    assert await db.find_installation(None, "T1") == {"bot_token": "xoxb-3"}

    assert await db.delete_installation(None, "T1", user_id="U1") == 1
    assert await db.find_installation(None, "T1") == {"bot_token": "xoxb-2"}
    assert await db.delete_installation(None, "T1") == 1
    assert await db.find_installation(None, "T1") is None
    assert await db.find_installation(None, "T2") == {"bot_token": "other-team"}


async def test_enterprise_install_ignores_team(db: Database) -> None:
    key = {"enterprise_id": "E1", "team_id": "T9", "user_id": "U1", "is_enterprise_install": True}
    await db.save_installation(key, {"bot_token": "org"})
    assert await db.find_installation("E1", "T-any", is_enterprise_install=True) == {
        "bot_token": "org"
    }
    assert await db.find_installation("E1", "T9") is None
    assert await db.find_installation("E2", None, is_enterprise_install=True) is None


async def test_oauth_state_single_use(db: Database) -> None:
    await db.issue_oauth_state("s1", expires_at=at(10))
    assert await db.consume_oauth_state("s1", now=at(1)) is True
    assert await db.consume_oauth_state("s1", now=at(2)) is False
    assert await db.consume_oauth_state("never-issued", now=at(2)) is False
    # Five callbacks racing for one state (issued first: on PostgreSQL operations in
    # flight together have no order, so a consume may not overtake its issue).
    await db.issue_oauth_state("s2", expires_at=at(10))
    results = await asyncio.gather(*(db.consume_oauth_state("s2", now=at(1)) for _ in range(5)))
    assert results.count(True) == 1


async def test_oauth_state_expires(db: Database) -> None:
    await db.issue_oauth_state("old", expires_at=T0 + timedelta(minutes=10))
    assert await db.consume_oauth_state("old", now=at(10)) is False
    # Expired states are gone, so a late replay can't succeed either.
    assert await db._fetchone("SELECT COUNT(*) FROM oauth_states") == (0,)


async def test_oauth_state_cannot_be_issued_twice(db: Database) -> None:
    await db.issue_oauth_state("dup", expires_at=at(10))
    with pytest.raises(StorageError):
        await db.issue_oauth_state("dup", expires_at=at(20))
