"""The flood counter several bot processes share (PostgreSQL; see `bot.ratelimit`).

Why a fixed window per member and not the in-process limiter's list of message times:
the shared count must be taken and raised in ONE atomic statement, or two processes
that each read "five of six" would both let a seventh through. An upsert that either
starts a new window or adds one to the current one, and returns the new count, is that
statement: it runs alone in autocommit (no BEGIN, no lock, no COMMIT), and PostgreSQL
serialises concurrent upserts of one row on the row itself, so each caller sees a
distinct count. The caller turns the count into allow / warn once / drop.

Why a hash and not the member's id: the row only has to tell one member's messages from
another's for a minute; ``member_key`` is a SHA-256 of the community and member ids, so
the table names no member. (A plain hash of an enumerable id can be reversed by trying
ids; the rows are short-lived and a forget-me deletes them anyway, so that is accepted
rather than depending on a secret the bot does not always have.) ``community_id`` stays
plain, so erasing a community finds its rows like every other table's.
"""

from __future__ import annotations

import hashlib
from datetime import datetime, timedelta

from storage.base import Conn, SqlBase, execute, fetchone, to_db_time
from storage.models import StorageError


def member_key(community_id: str, member_id: str) -> str:
    """The flood table's name for one member of one community."""
    digest = hashlib.sha256(f"{community_id}\x00{member_id}".encode()).hexdigest()
    return digest[:32]


_HIT = (
    "INSERT INTO flood_windows (community_id, member_key, window_start, hits) "
    "VALUES (?, ?, ?, 1) "
    "ON CONFLICT (community_id, member_key) DO UPDATE SET "
    "hits = CASE WHEN flood_windows.window_start <= ? THEN 1 "
    "ELSE flood_windows.hits + 1 END, "
    "window_start = CASE WHEN flood_windows.window_start <= ? THEN excluded.window_start "
    "ELSE flood_windows.window_start END "
    "RETURNING hits"
)


class FloodStore(SqlBase):
    async def flood_hit(
        self, community_id: str, member_id: str, at: datetime, window: timedelta
    ) -> int:
        """Count one message of the member at `at`; returns how many they sent in the
        current window, this one included (1 when it starts a new window: the previous
        one began `window` or longer before `at`)."""
        params = (
            community_id,
            member_key(community_id, member_id),
            to_db_time(at),
            to_db_time(at - window),
            to_db_time(at - window),
        )

        def work(conn: Conn) -> int:
            row = fetchone(conn, _HIT, params)
            if row is None:  # pragma: no cover - an upsert ... RETURNING returns its row
                raise StorageError("the flood counter returned nothing")
            return int(row[0])

        # One statement, its own transaction on both engines (see the module docstring):
        # no scope lock, so a flood check never queues behind a community's writes.
        return await self._run_outside_transaction(work)

    async def prune_flood(self, before: datetime) -> int:
        """Delete the windows that began at or before `before` (over by then, when
        `before` is now minus the window); returns how many."""
        return await self._run_write(
            lambda conn: execute(
                conn, "DELETE FROM flood_windows WHERE window_start <= ?", (to_db_time(before),)
            ),
            scope="flood",
        )
