"""The shared flood counter on both engines: one window per member, counted atomically
across connections, expired by housekeeping, and gone with a forget-me or an erasure."""

from __future__ import annotations

import asyncio
from datetime import timedelta

from storage import Database
from storage.flood import member_key

from .conftest import Backend, at

CID = "slack:T1"
MEMBER = "U0FLOODER"
OTHER = "U0CALM"
WINDOW = timedelta(seconds=60)
SECOND = 1 / 60  # `at` takes minutes


def stored(backend: Backend) -> list[tuple[object, ...]]:
    return backend.sql(
        "SELECT community_id, member_key, window_start, hits FROM flood_windows "
        "ORDER BY community_id, member_key"
    )


async def test_a_window_counts_each_message_and_a_new_one_starts_after_it(
    db: Database,
) -> None:
    counts = [await db.flood_hit(CID, MEMBER, at(i * SECOND), WINDOW) for i in range(8)]
    assert counts == [1, 2, 3, 4, 5, 6, 7, 8]
    # One second before the window's end: still the same window.
    assert await db.flood_hit(CID, MEMBER, at(59 * SECOND), WINDOW) == 9
    # The window began at second 0, so at second 60 it is over and one starts.
    assert await db.flood_hit(CID, MEMBER, at(60 * SECOND), WINDOW) == 1
    assert await db.flood_hit(CID, MEMBER, at(61 * SECOND), WINDOW) == 2
    assert await db.flood_hit(CID, MEMBER, at(119 * SECOND), WINDOW) == 3
    assert await db.flood_hit(CID, MEMBER, at(120 * SECOND), WINDOW) == 1


async def test_members_and_communities_have_their_own_windows_and_no_member_id_is_stored(
    db: Database, backend: Backend
) -> None:
    assert await db.flood_hit(CID, MEMBER, at(0), WINDOW) == 1
    assert await db.flood_hit(CID, MEMBER, at(0), WINDOW) == 2
    assert await db.flood_hit(CID, OTHER, at(0), WINDOW) == 1
    assert await db.flood_hit("slack:T2", MEMBER, at(0), WINDOW) == 1
    rows = stored(backend)
    assert len(rows) == 3
    assert not [r for r in rows if any(m in str(v) for v in r for m in (MEMBER, OTHER))]
    assert {str(r[1]) for r in rows} == {
        member_key(CID, MEMBER),
        member_key(CID, OTHER),
        member_key("slack:T2", MEMBER),
    }


async def test_two_connections_flooding_at_once_see_distinct_counts(backend: Backend) -> None:
    """Two `Database`s stand for two processes (on PostgreSQL: two pools, so the upserts
    really run at once); no count is handed out twice and none is skipped."""
    first, second = await backend.open(), await backend.open()
    try:
        counts = await asyncio.gather(
            *((first if i % 2 else second).flood_hit(CID, MEMBER, at(0), WINDOW) for i in range(40))
        )
    finally:
        await first.close()
        await second.close()
    assert sorted(counts) == list(range(1, 41))


async def test_housekeeping_prunes_windows_that_are_over(db: Database, backend: Backend) -> None:
    await db.flood_hit(CID, MEMBER, at(0), WINDOW)
    await db.flood_hit(CID, OTHER, at(30 * SECOND), WINDOW)
    # At second 60 the member's window is over, the other's is not.
    assert await db.prune_flood(at(60 * SECOND) - WINDOW) == 1
    assert [r[1] for r in stored(backend)] == [member_key(CID, OTHER)]
    assert await db.prune_flood(at(90 * SECOND) - WINDOW) == 1
    assert stored(backend) == []


async def test_a_forget_me_deletes_the_members_window_only(db: Database, backend: Backend) -> None:
    await db.flood_hit(CID, MEMBER, at(0), WINDOW)
    await db.flood_hit(CID, OTHER, at(0), WINDOW)
    await db.flood_hit("slack:T2", MEMBER, at(0), WINDOW)
    request = await db.begin_forget(CID, MEMBER, requested_by=MEMBER, reason="", at=at(1))
    await db.erase_member(request, [], at(2))
    assert [(r[0], r[1]) for r in stored(backend)] == sorted(
        [(CID, member_key(CID, OTHER)), ("slack:T2", member_key("slack:T2", MEMBER))]
    )


async def test_erasing_a_community_deletes_its_windows(db: Database, backend: Backend) -> None:
    await db.flood_hit(CID, MEMBER, at(0), WINDOW)
    await db.flood_hit("slack:T2", MEMBER, at(0), WINDOW)
    await db.erase_community(CID, at(1))
    assert [r[0] for r in stored(backend)] == ["slack:T2"]
