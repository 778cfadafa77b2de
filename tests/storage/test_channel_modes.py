"""Channel modes (`storage/channels.py`), on both engines: one row per channel a
moderator set, the latest setting winning; who set it listed by my-data and replaced by
the pseudonym on forget-me, by exact id; the rows go with the community's erasure
(tests/storage/test_removal.py fills them too)."""

from __future__ import annotations

from sonality.store import StateCommit
from storage import Database
from storage.channels import ChannelMode

from .conftest import Backend, at, state

CID = "discord:1"
OTHER_CID = "discord:2"
MOD = "9002"
MODLIKE = "90021"  # an id that the moderator's id is a prefix of


async def _set(db: Database, cid: str, channel: str, mode: ChannelMode, who: str, t: float) -> None:
    await db.set_channel_mode(
        cid,
        channel,
        mode,
        channel_name=f"name-{channel}",
        set_by_id=who,
        set_by_name=f"Name {who}",
        at=at(t),
    )


async def test_one_row_per_channel_the_latest_setting_winning(db: Database) -> None:
    assert await db.channel_settings(CID) == []
    await _set(db, CID, "10", ChannelMode.FREE, MOD, 1)
    await _set(db, CID, "11", ChannelMode.OFF, MOD, 2)
    await _set(db, CID, "10", ChannelMode.MENTION, MODLIKE, 3)
    await _set(db, OTHER_CID, "10", ChannelMode.OFF, MOD, 4)
    found = await db.channel_settings(CID)
    assert [(s.channel_id, s.mode, s.set_by_id, s.set_at) for s in found] == [
        ("10", ChannelMode.MENTION, MODLIKE, at(3)),
        ("11", ChannelMode.OFF, MOD, at(2)),
    ]
    assert found[1].channel_name == "name-11" and found[1].set_by_name == f"Name {MOD}"
    assert [s.mode for s in await db.channel_settings(OTHER_CID)] == [ChannelMode.OFF]


async def test_who_set_a_mode_is_listed_and_forgotten_by_exact_id(
    db: Database, backend: Backend
) -> None:
    await db.community(CID).commit(StateCommit(state=state(0), cause="seed", change="seed"))
    await _set(db, CID, "10", ChannelMode.FREE, MOD, 1)
    await _set(db, CID, "11", ChannelMode.OFF, MODLIKE, 2)

    mine = (await db.member_rows(CID, MOD)).channel_modes
    assert [(s.channel_id, s.mode) for s in mine] == [("10", ChannelMode.FREE)]
    assert [s.channel_id for s in (await db.member_rows(CID, MODLIKE)).channel_modes] == ["11"]

    request = await db.begin_forget(CID, MOD, requested_by="self", reason="", at=at(3))
    await db.erase_member(request, await db.member_words(CID, MOD), at(4))
    assert (await db.member_rows(CID, MOD)).channel_modes == ()
    modes = {s.channel_id: s for s in await db.channel_settings(CID)}
    # The mode stays (the community's); who set it is now the pseudonym.
    assert modes["10"].mode is ChannelMode.FREE
    assert modes["10"].set_by_id == modes["10"].set_by_name == request.pseudonym
    # The other moderator, whose id only starts like the forgotten one's, is untouched.
    assert (modes["11"].set_by_id, modes["11"].set_by_name) == (MODLIKE, f"Name {MODLIKE}")
    rows = backend.sql("SELECT set_by_id, set_by_name FROM channel_modes")
    assert not any(v in (MOD, f"Name {MOD}") for row in rows for v in row)
