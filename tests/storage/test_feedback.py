"""Members' thumbs up / down on replies, on both engines: one vote per member and reply,
kept under a hash instead of the member's id, listed by my-data, taken by forget-me and
by a community's erasure (tests/storage/test_removal.py fills it too)."""

from __future__ import annotations

from sonality.store import StateCommit
from storage import Database
from storage.feedback import FeedbackCounts

from .conftest import Backend, at, state

CID = "slack:T1"
OTHER_CID = "slack:T2"
MEMBER = "U0FEEDBACKER"


async def _communities(db: Database, *ids: str) -> None:
    for cid in ids:
        await db.touch_community(cid, "team", at(0))


async def test_one_vote_per_member_and_reply_the_latest_press_winning(db: Database) -> None:
    await _communities(db, CID, OTHER_CID)
    assert await db.feedback_counts(CID) == FeedbackCounts()
    assert await db.record_feedback(CID, "r1", MEMBER, True, at(1))
    assert await db.record_feedback(CID, "r1", MEMBER, False, at(2))  # changed their mind
    assert await db.feedback_counts(CID) == FeedbackCounts(positive=0, negative=1, replies=1)
    assert await db.record_feedback(CID, "r1", "U2", True, at(3))
    assert await db.record_feedback(CID, "r2", MEMBER, True, at(4))
    assert await db.record_feedback(OTHER_CID, "r1", MEMBER, False, at(5))
    assert await db.feedback_counts(CID) == FeedbackCounts(positive=2, negative=1, replies=2)
    assert await db.feedback_counts(OTHER_CID) == FeedbackCounts(negative=1, replies=1)


async def test_a_vote_kept_under_a_replys_older_id_is_replaced_not_counted_twice(
    db: Database,
) -> None:
    """Slack votes were once kept under the reply's bare ts, now under "channel:ts": a
    member pressing again on such a reply changes their vote, and only theirs."""
    await _communities(db, CID)
    await db.record_feedback(CID, "1700000000.000100", MEMBER, True, at(1))  # older release
    await db.record_feedback(CID, "1700000000.000100", "U2", True, at(1))
    assert await db.record_feedback(
        CID, "C1:1700000000.000100", MEMBER, False, at(2), replaces="1700000000.000100"
    )
    assert await db.feedback_counts(CID) == FeedbackCounts(positive=1, negative=1, replies=2)
    mine = (await db.member_rows(CID, MEMBER)).feedback
    assert [(f.reply_id, f.positive) for f in mine] == [("C1:1700000000.000100", False)]


async def test_a_press_where_no_data_is_kept_records_nothing(
    db: Database, backend: Backend
) -> None:
    assert not await db.record_feedback("slack:TGONE", "r1", MEMBER, True, at(1))
    assert backend.sql("SELECT COUNT(*) FROM reply_feedback") == [(0,)]


async def test_the_member_is_kept_as_a_hash_listed_by_my_data_and_forgotten(
    db: Database, backend: Backend
) -> None:
    store = db.community(CID)
    await store.commit(StateCommit(state=state(0), cause="seed", change="seed"))
    await db.record_feedback(CID, "r1", MEMBER, True, at(1))
    await db.record_feedback(CID, "r2", MEMBER, False, at(2))
    await db.record_feedback(CID, "r2", "U2", True, at(3))
    rows = backend.sql("SELECT * FROM reply_feedback")
    assert len(rows) == 3 and not any(MEMBER in str(v) for row in rows for v in row)

    mine = (await db.member_rows(CID, MEMBER)).feedback
    assert [(f.reply_id, f.positive, f.pressed_at) for f in mine] == [
        ("r1", True, at(1)),
        ("r2", False, at(2)),
    ]
    assert [f.reply_id for f in (await db.member_rows(CID, "U2")).feedback] == ["r2"]

    request = await db.begin_forget(CID, MEMBER, requested_by="self", reason="", at=at(4))
    await db.erase_member(request, await db.member_words(CID, MEMBER), at(5))
    assert (await db.member_rows(CID, MEMBER)).feedback == ()
    assert await db.feedback_counts(CID) == FeedbackCounts(positive=1, replies=1)
    assert len((await db.member_rows(CID, "U2")).feedback) == 1
