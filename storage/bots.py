"""Replies to other bots in a row, per channel (the count behind `bot.bot_exchanges`).

Why in the database and not in memory: the count is what stops two bots from answering
each other for ever. Kept in a process's memory, a restart (or, behind Slack's load
balancer, another process) would start it again at zero and let the loop run three
more rounds each time. One row per channel where the bot answered a bot, holding how
many times in a row; a person writing in the channel deletes it.

Why one statement per change: `claim_bot_reply` takes a reply and raises the count in
a single upsert that refuses at the limit, so two processes that see one bot message
each cannot both take the last reply.
"""

from __future__ import annotations

from storage.base import Conn, SqlBase, execute, fetchone

_CLAIM = (
    "INSERT INTO bot_exchanges (community_id, channel_id, replies) VALUES (?, ?, 1) "
    "ON CONFLICT (community_id, channel_id) DO UPDATE SET "
    "replies = bot_exchanges.replies + 1 WHERE bot_exchanges.replies < ? RETURNING replies"
)


class BotExchangeStore(SqlBase):
    async def claim_bot_reply(self, community_id: str, channel_id: str, limit: int) -> bool:
        """Count one more reply to a bot in the channel; False (nothing changed) when
        `limit` replies in a row were already given there."""

        def work(conn: Conn) -> bool:
            return fetchone(conn, _CLAIM, (community_id, channel_id, limit)) is not None

        return await self._run_outside_transaction(work)

    async def clear_bot_replies(self, community_id: str, channel_id: str) -> None:
        """A person wrote in the channel: the bots' row of replies ends there."""
        await self._run_outside_transaction(
            lambda conn: execute(
                conn,
                "DELETE FROM bot_exchanges WHERE community_id = ? AND channel_id = ?",
                (community_id, channel_id),
            )
        )

    async def bot_reply_counts(self) -> dict[tuple[str, str], int]:
        """Every channel's count of replies to bots in a row (community, channel)."""
        rows = await self._fetchall("SELECT community_id, channel_id, replies FROM bot_exchanges")
        return {(str(c), str(ch)): int(n) for c, ch, n in rows}
