"""Short-term conversation buffers: the last few exchanges of each user in a community.

Why in SQLite and not in memory: the bot may restart (deploy, crash) in the middle of a
conversation, and agents for idle communities are evicted from memory; the buffer lets
the next reply still see what was just said. It is bounded three ways (turn count,
characters, age) because it goes into every prompt and costs tokens.

Both turns of one exchange are written in one transaction and share an ``exchange``
number, so readers and pruning always keep user+assistant pairs whole: a prompt that
starts with a dangling assistant turn would confuse the model and break the strict
user/assistant alternation the LLM API expects.
"""

from __future__ import annotations

from datetime import datetime

from storage.base import Conn, SqlBase, ensure_community, execute, fetchone, to_db_time
from storage.forgotten import deleted_since, forgotten_since
from storage.models import Role, StorageError

MAX_EXCHANGES_PER_USER = 50
"""Exchanges (user+assistant pairs, i.e. 2 rows each) kept per user; older ones are pruned
on every append so the table can't grow without bound for a chatty user."""


class BufferStore(SqlBase):
    async def append_exchange(
        self,
        community_id: str,
        user_id: str,
        user_text: str,
        reply_text: str,
        at: datetime,
        *,
        keep_exchanges: int = MAX_EXCHANGES_PER_USER,
        asked_at: datetime | None = None,
        message_ref: str = "",
    ) -> bool:
        """Store one user message and the bot's reply (one transaction), then prune.

        Keeps at most `keep_exchanges` exchanges for this user in this community.
        With `asked_at` (when the message came in), nothing is stored if the user ran
        forget-me since or is being forgotten (`forgotten_since`), or if the message
        (`message_ref`, the platform's id of it) was deleted since; returns whether it
        was stored.
        """
        if keep_exchanges < 1:
            raise StorageError("keep_exchanges must be at least 1")
        stamp = to_db_time(at)

        def work(conn: Conn) -> bool:
            if asked_at is not None and (
                forgotten_since(conn, community_id, user_id, asked_at)
                or deleted_since(conn, community_id, message_ref, asked_at)
            ):
                return False
            ensure_community(conn, community_id, at)
            row = fetchone(
                conn,
                "SELECT COALESCE(MAX(exchange), 0) + 1 FROM conversation_turns "
                "WHERE community_id = ? AND user_id = ?",
                (community_id, user_id),
            )
            exchange = int(row[0]) if row else 1
            for role, content in (("user", user_text), ("assistant", reply_text)):
                execute(
                    conn,
                    "INSERT INTO conversation_turns "
                    "(community_id, user_id, exchange, role, content, created_at, message_ref) "
                    "VALUES (?, ?, ?, ?, ?, ?, ?)",
                    (community_id, user_id, exchange, role, content, stamp, message_ref or None),
                )
            execute(
                conn,
                "DELETE FROM conversation_turns WHERE community_id = ? AND user_id = ? "
                "AND exchange <= ?",
                (community_id, user_id, exchange - keep_exchanges),
            )
            return True

        return await self._run_write(work, scope=community_id)

    async def recent_turns(
        self,
        community_id: str,
        user_id: str,
        max_turns: int,
        max_chars: int,
        not_older_than: datetime | None = None,
        step_pairs: int = 1,
    ) -> list[tuple[Role, str]]:
        """The newest whole exchanges that fit, oldest first, as (role, content).

        `step_pairs` > 1 moves the window's start in steps of that many exchanges
        instead of one at a time, so the same earlier turns open the conversation for
        several messages in a row and a vendor's prompt cache keeps matching them; the
        window then holds between `max_turns // 2 - step_pairs + 1` and `max_turns // 2`
        exchanges.

        `max_turns` counts messages (a user turn and an assistant turn are two, as in
        `ChatTurn`), so an odd limit rounds down to whole pairs. `max_chars` bounds the
        summed content length. Selection walks back from the newest exchange and stops at
        the first one that doesn't fit or is older than `not_older_than`, so the result is
        always a contiguous, gap-free tail of the conversation.
        """
        max_pairs = max_turns // 2
        if max_pairs <= 0 or max_chars <= 0:
            return []
        sql = (
            "SELECT exchange, role, content FROM conversation_turns "
            "WHERE community_id = ? AND user_id = ?"
        )
        params: list[object] = [community_id, user_id]
        if not_older_than is not None:
            sql += " AND created_at >= ?"
            params.append(to_db_time(not_older_than))
        sql += " ORDER BY exchange DESC, id ASC LIMIT ?"
        params.append(max_pairs * 2)
        rows = await self._fetchall(sql, params)

        pairs: dict[int, dict[str, str]] = {}
        for exchange, role, content in rows:
            pairs.setdefault(int(exchange), {})[str(role)] = str(content)
        if rows and step_pairs > 1:
            over = int(rows[0][0]) - max_pairs  # rows[0] is of the newest exchange
            cut = -(-over // step_pairs) * step_pairs if over > 0 else 0
            pairs = {e: pair for e, pair in pairs.items() if e > cut}

        chosen: list[tuple[Role, str]] = []  # newest pair first, reversed at the end
        used = 0
        for exchange in sorted(pairs, reverse=True):
            pair = pairs[exchange]
            if "user" not in pair or "assistant" not in pair:
                break
            size = len(pair["user"]) + len(pair["assistant"])
            if used + size > max_chars:
                break
            used += size
            chosen.append(("assistant", pair["assistant"]))
            chosen.append(("user", pair["user"]))
        chosen.reverse()
        return chosen

    async def prune_turns(self, older_than: datetime) -> int:
        """Delete buffered turns (all communities) created before `older_than`.

        Both turns of an exchange share one timestamp, so this never splits a pair.
        Returns the number of rows removed.
        """
        stamp = to_db_time(older_than)
        return await self._run_write(
            lambda conn: execute(
                conn, "DELETE FROM conversation_turns WHERE created_at < ?", (stamp,)
            )
        )
