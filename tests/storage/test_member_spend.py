"""`member_spend` (storage/spend.py), on both engines: members' spend per day, the one
notice a day, and the rows as member data (forget-me, my-data, housekeeping)."""

from __future__ import annotations

import asyncio
from datetime import date, timedelta

from storage import Database
from storage.forget import MemberWords
from storage.spend import MemberSpend

from .conftest import Backend, at

CID = "slack:T1"
DAY = date(2025, 1, 1)
# Bob's id is a prefix of Bobby's: a forget by substring would take Bobby's row too.
BOB, BOBBY = "terminal-bob", "terminal-bobby"


def spend(member: str, usd: float, day: date = DAY, cid: str = CID) -> MemberSpend:
    return MemberSpend(community_id=cid, day=day, member_id=member, usd=usd, calls=1, tokens=10)


def stored(backend: Backend) -> list[tuple[str, str, str]]:
    rows = backend.sql("SELECT community_id, day, member_id FROM member_spend ORDER BY 1, 2, 3")
    return [(str(r[0]), str(r[1]), str(r[2])) for r in rows]


async def test_amounts_add_up_per_member_and_day(db: Database) -> None:
    await db.add_member_spend([spend(BOB, 0.25), spend(BOBBY, 0.5)])
    await db.add_member_spend([spend(BOB, 0.5), spend(BOB, 1.0, DAY + timedelta(days=1))])
    today = await db.member_spend(CID, DAY)
    assert [(s.member_id, s.usd, s.calls, s.tokens) for s in today] == [
        (BOB, 0.75, 2, 20),
        (BOBBY, 0.5, 1, 10),
    ]
    assert [s.usd for s in await db.member_spend(CID, DAY + timedelta(days=1))] == [1.0]
    assert await db.member_spend("slack:T2", DAY) == []


async def test_the_share_notice_is_claimed_once_a_day_whoever_asks(db: Database) -> None:
    await db.add_member_spend([spend(BOB, 3.0)])
    # Many claims at once (as several processes would make them): exactly one wins.
    claims = await asyncio.gather(*(db.claim_share_notice(CID, DAY, BOB) for _ in range(8)))
    assert sorted(claims) == [False] * 7 + [True]
    assert await db.claim_share_notice(CID, DAY, BOB) is False
    # Another member, another day: their own notice. A claim adds no spend.
    assert await db.claim_share_notice(CID, DAY, BOBBY) is True
    assert await db.claim_share_notice(CID, DAY + timedelta(days=1), BOB) is True
    assert [(s.member_id, s.usd) for s in await db.member_spend(CID, DAY)] == [(BOB, 3.0)]


async def test_a_forget_me_deletes_exactly_the_members_rows(db: Database, backend: Backend) -> None:
    await db.add_member_spend(
        [spend(BOB, 1.0), spend(BOB, 2.0, DAY + timedelta(days=1)), spend(BOBBY, 1.0)]
    )
    await db.add_member_spend([spend(BOB, 1.0, cid="slack:T2")])
    await db.claim_share_notice(CID, DAY, BOB)
    request = await db.begin_forget(CID, BOB, requested_by=BOB, reason="", at=at(1))
    await db.erase_member(request, MemberWords(), at(2))
    assert stored(backend) == [
        (CID, DAY.isoformat(), BOBBY),
        ("slack:T2", DAY.isoformat(), BOB),  # another community's Bob is another member
    ]


async def test_the_members_data_lists_their_spend_only(db: Database) -> None:
    await db.add_member_spend([spend(BOB, 1.5), spend(BOBBY, 9.0)])
    await db.claim_share_notice(CID, DAY, BOB)
    rows = (await db.member_rows(CID, BOB)).spend
    assert [(r.day, r.usd, r.calls, r.told_share_spent) for r in rows] == [
        (DAY.isoformat(), 1.5, 1, True)
    ]
    assert (await db.member_rows("slack:T2", BOB)).spend == ()


async def test_housekeeping_deletes_past_days_and_erasing_a_community_its_rows(
    db: Database, backend: Backend
) -> None:
    yesterday, today = DAY, DAY + timedelta(days=1)
    await db.add_member_spend([spend(BOB, 1.0, yesterday), spend(BOB, 1.0, today)])
    await db.add_member_spend([spend(BOB, 1.0, today, cid="slack:T2")])
    assert await db.prune_member_spend(today) == 1
    assert stored(backend) == [(CID, today.isoformat(), BOB), ("slack:T2", today.isoformat(), BOB)]
    await db.erase_community(CID, at(1))
    assert stored(backend) == [("slack:T2", today.isoformat(), BOB)]


async def test_spend_on_a_reply_in_flight_during_a_forget_me_is_not_stored(
    db: Database, backend: Backend
) -> None:
    """A reply's cost is written after its call ends; if the member's forget-me was
    journaled since their message came in, the amount is dropped, not stored: their id
    would otherwise be back in a table right after the forget-me erased it."""
    request = await db.begin_forget(CID, BOB, requested_by=BOB, reason="", at=at(2))
    await db.erase_member(request, MemberWords(), at(3))
    in_flight = spend(BOB, 1.0).model_copy(update={"since": at(1)})
    later = spend(BOBBY, 1.0).model_copy(update={"since": at(1)})
    await db.add_member_spend([in_flight, later])
    assert stored(backend) == [(CID, DAY.isoformat(), BOBBY)]
    # What Bob spends on a message sent after his forget-me counts as anyone's.
    await db.add_member_spend([spend(BOB, 0.5).model_copy(update={"since": at(4)})])
    assert stored(backend) == [(CID, DAY.isoformat(), BOB), (CID, DAY.isoformat(), BOBBY)]
