"""Token usage as a daily rollup per community, local day, role and model; spending limits."""

from __future__ import annotations

from datetime import UTC, date, datetime
from pathlib import Path

import pytest

from sonality.llm import Usage
from sonality.store import UsageRecord
from storage import DailyUsage, Database
from storage.models import IntegrityViolation

from .conftest import Backend, commit_of, record

CID = "discord:1"


def used(purpose: str, at: datetime, model: str = "m", **tokens: int) -> UsageRecord:
    return UsageRecord(purpose=purpose, model=model, usage=Usage(**tokens), created_at=at)


def _rows(where: Backend | Path) -> list[tuple[object, ...]]:
    backend = where if isinstance(where, Backend) else Backend("sqlite", where, None)
    return backend.sql(
        "SELECT community_id, day, role, model, calls, input_tokens, output_tokens, "
        "cache_write_tokens, cache_read_tokens FROM usage_daily ORDER BY 1, 2, 3, 4"
    )


async def test_calls_on_one_day_with_one_model_share_a_row(db: Database, backend: Backend) -> None:
    noon = datetime(2025, 3, 1, 12, 0, tzinfo=UTC)
    store = db.community(CID)
    await store.commit(
        commit_of(
            0,
            usage=[
                used("ess", noon, input_tokens=100, output_tokens=10, cache_write_tokens=7),
                used("insight", noon, input_tokens=5, output_tokens=1, cache_read_tokens=3),
            ],
        )
    )
    await store.record_usage([used("ess", noon, input_tokens=1000)])
    assert _rows(backend) == [
        (CID, "2025-03-01", "evidence", "m", 3, 1105, 11, 7, 3),
    ]


async def test_roles_and_models_get_rows_of_their_own(db: Database) -> None:
    noon = datetime(2025, 3, 1, 12, 0, tzinfo=UTC)
    store = db.community(CID)
    await store.record_interaction(record("i1"))  # the reply: 10 in, 5 out, 2 cache read
    await store.commit(
        commit_of(
            0,
            usage=[
                used("ess", noon, input_tokens=3),
                used("ess", noon, model="other", input_tokens=4),
                used("reflection", noon, output_tokens=9),
            ],
        )
    )
    rows = await db.usage_days(CID)
    assert {(r.role, r.model, r.calls) for r in rows} == {
        ("reply", "test-model", 1),
        ("evidence", "m", 1),
        ("evidence", "other", 1),
        ("reflection", "m", 1),
    }
    totals = await db.usage_totals(CID)
    assert totals.calls == 4
    assert totals.by_role["evidence"] == Usage(input_tokens=7)
    assert totals.by_role["reply"] == Usage(input_tokens=10, output_tokens=5, cache_read_tokens=2)
    assert totals.by_role["reflection"] == Usage(output_tokens=9)


async def test_days_split_at_local_midnight(backend: Backend) -> None:
    """New York is UTC-5 in January: its midnight is 05:00 UTC."""
    db = await backend.open(timezone="America/New_York")
    try:
        before = datetime(2025, 1, 2, 4, 59, tzinfo=UTC)  # 23:59 on Jan 1 in New York
        after = datetime(2025, 1, 2, 5, 1, tzinfo=UTC)  # 00:01 on Jan 2
        await db.community(CID).record_usage(
            [used("reply", before, input_tokens=1), used("reply", after, input_tokens=2)]
        )
        rows = await db.usage_days(CID)
        assert [(r.day, r.usage.input_tokens) for r in rows] == [
            (date(2025, 1, 1), 1),
            (date(2025, 1, 2), 2),
        ]
    finally:
        await db.close()
    utc = await backend.open()  # the same two calls fall on one UTC day
    try:
        await utc.community("discord:2").record_usage(
            [used("reply", before, input_tokens=1), used("reply", after, input_tokens=2)]
        )
        [row] = await utc.usage_days("discord:2")
        assert (row.day, row.calls, row.usage.input_tokens) == (date(2025, 1, 2), 2, 3)
    finally:
        await utc.close()


async def test_a_day_range_includes_both_ends_and_only_this_community(db: Database) -> None:
    for day in (1, 2, 3, 4):
        at = datetime(2025, 3, day, 12, 0, tzinfo=UTC)
        await db.community(CID).record_usage([used("reply", at, input_tokens=day)])
        await db.community("discord:other").record_usage([used("reply", at, input_tokens=99)])
    rows = await db.usage_days(CID, date(2025, 3, 2), date(2025, 3, 3))
    assert rows == [
        DailyUsage(
            day=date(2025, 3, d), role="reply", model="m", calls=1, usage=Usage(input_tokens=d)
        )
        for d in (2, 3)
    ]
    assert (await db.usage_totals(CID, first=date(2025, 3, 3))).input_tokens == 3 + 4
    assert (await db.usage_totals(CID, last=date(2025, 3, 1))).input_tokens == 1
    assert (await db.usage_totals(CID)).calls == 4


async def test_the_migration_moves_per_call_rows_into_the_rollup(
    empty_backend: Backend,
) -> None:
    backend = empty_backend
    await backend.migrate_to(2)
    old_rows = [
        # community, purpose, model, in, out, cache read, cache write, created_at (UTC)
        (CID, "reply", "m", 10, 1, 2, 3, "2025-01-01T10:00:00.000000+00:00"),
        (CID, "reply", "m", 20, 2, 0, 0, "2025-01-01T23:59:59.000000+00:00"),
        (CID, "ess", "m", 5, 1, 0, 0, "2025-01-01T11:00:00.000000+00:00"),
        (CID, "insight", "m", 6, 1, 0, 0, "2025-01-01T11:00:01.000000+00:00"),
        (CID, "reflection", "big", 7, 70, 0, 0, "2025-01-02T00:00:00.000000+00:00"),
        ("slack:T1", "reply", "m", 1, 1, 1, 1, "2025-01-01T10:00:00.000000+00:00"),
    ]
    for cid in (CID, "slack:T1"):
        backend.run(
            "INSERT INTO communities (id, platform, name, created_at) VALUES (?, '', '', ?)",
            (cid, "2025-01-01T00:00:00.000000+00:00"),
        )
    for row in old_rows:
        backend.run(
            "INSERT INTO token_usage (community_id, purpose, model, input_tokens, "
            "output_tokens, cache_read_tokens, cache_write_tokens, created_at) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            row,
        )
    db = await backend.open(timezone="Asia/Tokyo")  # old rows keep their UTC date
    await db.close()
    assert _rows(backend) == [
        (CID, "2025-01-01", "evidence", "m", 2, 11, 2, 0, 0),
        (CID, "2025-01-01", "reply", "m", 2, 30, 3, 3, 2),
        (CID, "2025-01-02", "reflection", "big", 1, 7, 70, 0, 0),
        ("slack:T1", "2025-01-01", "reply", "m", 1, 1, 1, 1, 1),
    ]
    assert "token_usage" not in backend.tables()


async def test_budget_override_set_off_and_cleared(db: Database) -> None:
    assert await db.budget_override(CID) is None
    await db.set_budget_override(CID, 2.5, set_by="Ada (u1)")
    override = await db.budget_override(CID)
    assert override is not None
    assert (override.daily_limit_usd, override.set_by) == (2.5, "Ada (u1)")
    await db.set_budget_override(CID, None, set_by="Bo (u2)")  # explicitly no limit
    override = await db.budget_override(CID)
    assert override is not None and override.daily_limit_usd is None
    assert await db.budget_override("discord:other") is None
    await db.clear_budget_override(CID)
    assert await db.budget_override(CID) is None


async def test_a_negative_limit_is_refused_by_the_database(db: Database) -> None:
    with pytest.raises(IntegrityViolation, match="daily_limit_usd"):
        await db.set_budget_override(CID, -1.0, set_by="x")
    assert await db.budget_override(CID) is None
