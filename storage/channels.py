"""Where the bot may speak: the mode of each channel a moderator set, per community.

Why rows only for channels a moderator set: every other channel follows the operator's
default (SONALITY_CHANNEL_MODE), so changing that default reaches every channel nobody
chose for, and a community that never used `/sonality channel` has no rows at all.

Who set a mode is kept (the member's id and the name they used), because moderators ask
"who turned it off here?". That is member data: `my-data` lists the modes a member set
(`storage.export`), a forget-me replaces their id and name with the pseudonym and keeps
the mode, which is the community's setting (`storage.forget`), and erasing the
community takes the rows with it (the table has a `community_id`).
"""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum

from pydantic import BaseModel, ConfigDict

from storage.base import (
    Conn,
    Row,
    SqlBase,
    ensure_community,
    execute,
    fetchall,
    from_db_time,
    to_db_time,
)


class ChannelMode(StrEnum):
    #: Answers @mentions, replies to its messages and DMs (the bot's first behaviour).
    MENTION = "mention"
    #: Answers every member's message there too, at a paced rate.
    FREE = "free"
    #: Answers nothing there (commands still work).
    OFF = "off"


class ChannelSetting(BaseModel):
    """One channel's mode as a moderator set it."""

    model_config = ConfigDict(frozen=True)

    channel_id: str
    #: The channel's name when the mode was set (shown in lists; it may have changed).
    channel_name: str
    mode: ChannelMode
    set_by_id: str
    set_by_name: str
    set_at: datetime


_COLUMNS = "channel_id, channel_name, mode, set_by_id, set_by_name, set_at"


def settings_from_rows(rows: list[Row]) -> list[ChannelSetting]:
    return [
        ChannelSetting(
            channel_id=str(r[0]),
            channel_name=str(r[1]),
            mode=ChannelMode(str(r[2])),
            set_by_id=str(r[3]),
            set_by_name=str(r[4]),
            set_at=from_db_time(r[5]),
        )
        for r in rows
    ]


def member_channel_settings(conn: Conn, community_id: str, member_id: str) -> list[ChannelSetting]:
    """The modes `member_id` set in `community_id` (for `my-data`), by exact id."""
    return settings_from_rows(
        fetchall(
            conn,
            f"SELECT {_COLUMNS} FROM channel_modes WHERE community_id = ? AND set_by_id = ? "
            "ORDER BY set_at, channel_id",
            (community_id, member_id),
        )
    )


class ChannelModeStore(SqlBase):
    async def channel_settings(self, community_id: str) -> list[ChannelSetting]:
        """Every channel of the community whose mode a moderator set."""
        rows = await self._fetchall(
            f"SELECT {_COLUMNS} FROM channel_modes WHERE community_id = ? ORDER BY channel_id",
            (community_id,),
        )
        return settings_from_rows(rows)

    async def set_channel_mode(
        self,
        community_id: str,
        channel_id: str,
        mode: ChannelMode,
        *,
        channel_name: str,
        set_by_id: str,
        set_by_name: str,
        at: datetime,
    ) -> None:
        """Set one channel's mode, replacing what was set before (and by whom)."""
        params = (
            community_id,
            channel_id,
            channel_name,
            str(mode),
            set_by_id,
            set_by_name,
            to_db_time(at),
        )

        def work(conn: Conn) -> None:
            ensure_community(conn, community_id, at)
            execute(
                conn,
                f"INSERT INTO channel_modes (community_id, {_COLUMNS}) "
                "VALUES (?, ?, ?, ?, ?, ?, ?) "
                "ON CONFLICT (community_id, channel_id) DO UPDATE SET mode = excluded.mode, "
                "channel_name = excluded.channel_name, "
                "set_by_id = excluded.set_by_id, set_by_name = excluded.set_by_name, "
                "set_at = excluded.set_at",
                params,
            )

        await self._run_write(work, scope=community_id)
