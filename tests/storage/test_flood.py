"""The shared flood counter on both engines: one window per member (and the one before),
counted atomically across connections, one notice per window, expired by housekeeping,
and gone with a forget-me or an erasure."""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta

from storage import Database
from storage.flood import FloodCount, member_key
from storage.forget import MemberWords

from .conftest import Backend, at

CID = "slack:T1"
MEMBER = "U0FLOODER"
OTHER = "U0CALM"
WINDOW = timedelta(seconds=60)
SECOND = 1 / 60  # `at` takes minutes


async def hits(db: Database, member: str, when: datetime, cid: str = CID) -> int:
    return (await db.flood_hit(cid, member, when, WINDOW)).hits


def stored(backend: Backend) -> list[tuple[object, ...]]:
    return backend.sql(
        "SELECT community_id, member_key, window_start, hits FROM flood_windows "
        "ORDER BY community_id, member_key"
    )


async def test_a_window_counts_each_message_and_a_new_one_starts_after_it(
    db: Database,
) -> None:
    counts = [await hits(db, MEMBER, at(i * SECOND)) for i in range(8)]
    assert counts == [1, 2, 3, 4, 5, 6, 7, 8]
    # One second before the window's end: still the same window.
    assert await hits(db, MEMBER, at(59 * SECOND)) == 9
    # The window began at second 0, so at second 60 it is over and one starts.
    assert await hits(db, MEMBER, at(60 * SECOND)) == 1
    assert await hits(db, MEMBER, at(61 * SECOND)) == 2
    assert await hits(db, MEMBER, at(119 * SECOND)) == 3
    assert await hits(db, MEMBER, at(120 * SECOND)) == 1


async def test_members_and_communities_have_their_own_windows_and_no_member_id_is_stored(
    db: Database, backend: Backend
) -> None:
    assert await hits(db, MEMBER, at(0)) == 1
    assert await hits(db, MEMBER, at(0)) == 2
    assert await hits(db, OTHER, at(0)) == 1
    assert await hits(db, MEMBER, at(0), "slack:T2") == 1
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
        # One notice for the flood, whichever connection asks first.
        claims = await asyncio.gather(
            *(
                (first if i % 2 else second).flood_warn(CID, MEMBER, at(0), WINDOW)
                for i in range(10)
            )
        )
    finally:
        await first.close()
        await second.close()
    assert sorted(c.hits for c in counts) == list(range(1, 41))
    assert sorted(claims) == [False] * 9 + [True]


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
    await db.erase_member(request, MemberWords(), at(2))
    assert [(r[0], r[1]) for r in stored(backend)] == sorted(
        [(CID, member_key(CID, OTHER)), ("slack:T2", member_key("slack:T2", MEMBER))]
    )


async def test_erasing_a_community_deletes_its_windows(db: Database, backend: Backend) -> None:
    await db.flood_hit(CID, MEMBER, at(0), WINDOW)
    await db.flood_hit("slack:T2", MEMBER, at(0), WINDOW)
    await db.erase_community(CID, at(1))
    assert [r[0] for r in stored(backend)] == ["slack:T2"]


async def test_a_new_window_keeps_the_one_before_while_its_last_message_is_recent(
    db: Database,
) -> None:
    for second in (0, 20, 50):
        await db.flood_hit(CID, MEMBER, at(second * SECOND), WINDOW)
    # At second 60 the window is over; its last message (second 50) is 10 s old.
    count = await db.flood_hit(CID, MEMBER, at(60 * SECOND), WINDOW)
    assert count == FloodCount(
        hits=1,
        previous_hits=3,
        previous_first=at(0),
        previous_last=at(50 * SECOND),
    )
    # Within the window, the previous one stays as it was.
    assert (await db.flood_hit(CID, MEMBER, at(61 * SECOND), WINDOW)).previous_hits == 3
    # At second 130 the window of second 60 is over, and its last message (61) is more
    # than a window old: nothing is carried.
    later = await db.flood_hit(CID, MEMBER, at(130 * SECOND), WINDOW)
    assert (later.hits, later.previous_hits) == (1, 0)


def test_recent_counts_the_share_of_the_previous_window_still_inside_the_sliding_one() -> None:
    """Previous messages are taken as evenly spaced from first to last, and one exactly a
    window old no longer counts (as in the in-process limiter)."""
    six = FloodCount(hits=1, previous_hits=6, previous_first=at(0), previous_last=at(5 * SECOND))

    def recent(count: FloodCount, second: float, cap: int = 6) -> int:
        return count.recent(at(second * SECOND), WINDOW, carried_at_most=cap)

    # Six at seconds 0..5; at 60 the one at 0 is a window old, the other five count.
    assert recent(six, 60) == 1 + 5
    assert recent(six, 62.5) == 1 + 3
    assert recent(six, 65) == 1  # the last one is a window old too
    assert recent(six, 30) == 1 + 6  # (not reached in use: all still inside)
    assert recent(six, 60, cap=2) == 1 + 1  # at most `cap` carried: two, at 0 and 5
    # All at one instant: all count until that instant is a window old.
    burst = six.model_copy(update={"previous_last": at(0)})
    assert (recent(burst, 59.9), recent(burst, 60)) == (7, 1)
    # The boundary flood: one message at 0, five at 59.5, then the next window at 60.
    # Taken as spread over 0..59.5, five of the six still count at 60: the member has
    # one message left, not a fresh six.
    edge = six.model_copy(update={"previous_last": at(59.5 * SECOND)})
    assert recent(edge, 60) == 1 + 5
    assert recent(FloodCount(hits=4), 60) == 4


async def test_one_notice_per_window_and_housekeeping_uses_the_last_message(
    db: Database, backend: Backend
) -> None:
    await db.flood_hit(CID, MEMBER, at(0), WINDOW)
    assert await db.flood_warn(CID, MEMBER, at(1 * SECOND), WINDOW) is True
    assert await db.flood_warn(CID, MEMBER, at(30 * SECOND), WINDOW) is False
    assert await db.flood_warn(CID, MEMBER, at(61 * SECOND), WINDOW) is True
    assert await db.flood_warn(CID, OTHER, at(0), WINDOW) is False  # no row: no flood
    # A window that began at 0 but whose last message was at 50 is kept until 110.
    await db.flood_hit(CID, MEMBER, at(50 * SECOND), WINDOW)
    assert await db.prune_flood(at(100 * SECOND) - WINDOW) == 0
    assert await db.prune_flood(at(110 * SECOND) - WINDOW) == 1
    assert stored(backend) == []


async def test_the_members_data_lists_their_flood_row_only(db: Database) -> None:
    await db.flood_hit(CID, MEMBER, at(0), WINDOW)
    await db.flood_hit(CID, MEMBER, at(10 * SECOND), WINDOW)
    await db.flood_hit(CID, OTHER, at(0), WINDOW)
    flood = (await db.member_rows(CID, MEMBER)).flood
    assert flood is not None
    assert (flood.messages, flood.window_start, flood.last_message) == (2, at(0), at(10 * SECOND))
    assert (await db.member_rows("slack:T2", MEMBER)).flood is None
