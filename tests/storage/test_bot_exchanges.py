"""`bot_exchanges` (storage/bots.py), on both engines: the count of replies to other bots
in a row per channel, taken atomically at the limit, cleared per channel, and erased
with its community."""

from __future__ import annotations

import asyncio

from storage import Database

from .conftest import Backend, at

CID, OTHER = "discord:1", "discord:2"


async def test_replies_are_counted_per_channel_up_to_the_limit(db: Database) -> None:
    assert [await db.claim_bot_reply(CID, "c1", 3) for _ in range(4)] == [True] * 3 + [False]
    # Another channel, another community: counts of their own.
    assert await db.claim_bot_reply(CID, "c2", 3) is True
    assert await db.claim_bot_reply(OTHER, "c1", 3) is True
    assert await db.bot_reply_counts() == {(CID, "c1"): 3, (CID, "c2"): 1, (OTHER, "c1"): 1}


async def test_the_last_reply_is_taken_once_however_many_ask_at_once(db: Database) -> None:
    await db.claim_bot_reply(CID, "c1", 3)
    await db.claim_bot_reply(CID, "c1", 3)
    # As several processes would: eight claims for the one reply left, exactly one wins.
    claims = await asyncio.gather(*(db.claim_bot_reply(CID, "c1", 3) for _ in range(8)))
    assert sorted(claims) == [False] * 7 + [True]
    assert await db.bot_reply_counts() == {(CID, "c1"): 3}


async def test_a_person_clears_only_their_channel(db: Database) -> None:
    for channel in ("c1", "c2"):
        for _ in range(3):
            await db.claim_bot_reply(CID, channel, 3)
    await db.clear_bot_replies(CID, "c1")
    await db.clear_bot_replies(CID, "never-counted")  # nothing there: nothing happens
    assert await db.bot_reply_counts() == {(CID, "c2"): 3}
    assert await db.claim_bot_reply(CID, "c1", 3) is True
    assert await db.claim_bot_reply(CID, "c2", 3) is False


async def test_the_counts_go_with_their_community(db: Database, backend: Backend) -> None:
    await db.claim_bot_reply(CID, "c1", 3)
    await db.claim_bot_reply(OTHER, "c1", 3)
    await db.erase_community(CID, at(0))
    assert backend.sql("SELECT community_id, channel_id, replies FROM bot_exchanges") == [
        (OTHER, "c1", 1)
    ]
