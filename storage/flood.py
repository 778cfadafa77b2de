"""The flood counter several bot processes share (PostgreSQL; see `bot.ratelimit`).

Why a fixed window per member and not the in-process limiter's list of message times:
the shared count must be taken and raised in ONE atomic statement, or two processes
that each read "five of six" would both let a seventh through. An upsert that either
starts a new window or adds one to the current one, and returns the new count, is that
statement: it runs alone in autocommit (no BEGIN, no lock, no COMMIT), and PostgreSQL
serialises concurrent upserts of one row on the row itself, so each caller sees a
distinct count. The caller turns the count into allow / over; the "slow down" notice
for an over-limit message is claimed by a second statement (`flood_warn`), one per window.

Why the row also keeps the window before: a fixed window alone would let a member send
the limit at the end of one window and again at the start of the next. When a new
window starts less than a window after the last one's latest message, the row keeps the
last one's count and the span its messages fell in (first to last), so the caller can
add the share of them still inside the sliding window (`FloodCount.recent`).

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

from pydantic import BaseModel, ConfigDict

from storage.base import Conn, SqlBase, execute, fetchone, from_db_time, to_db_time
from storage.models import StorageError


def member_key(community_id: str, member_id: str) -> str:
    """The flood table's name for one member of one community."""
    digest = hashlib.sha256(f"{community_id}\x00{member_id}".encode()).hexdigest()
    return digest[:32]


class FloodCount(BaseModel):
    """One member's count after a message, as the shared row holds it."""

    model_config = ConfigDict(frozen=True)

    hits: int  # messages in the current window, this one included
    previous_hits: int = 0  # in the window before, if it ended less than a window ago
    previous_first: datetime | None = None  # its first and last message
    previous_last: datetime | None = None

    def recent(self, at: datetime, window: timedelta, carried_at_most: int) -> int:
        """Messages in the sliding window ending at `at`: this window's, plus those of
        the previous window (at most `carried_at_most` of them) sent after
        `at - window`, taking them as evenly spaced from its first to its last message
        (a message exactly `window` old no longer counts, as in `bot.ratelimit`)."""
        carried = min(self.previous_hits, carried_at_most)
        first, last = self.previous_first, self.previous_last
        if carried <= 0 or first is None or last is None:
            return self.hits
        start = at - window
        if last <= start:
            return self.hits
        if first > start:
            return self.hits + carried
        if carried == 1:  # the one counted is taken as the latest: the stricter guess
            return self.hits + 1
        step = (last - first) / (carried - 1)
        if step <= timedelta(0):  # closer together than a microsecond each
            return self.hits + carried
        expired = (start - first) // step + 1  # those at first, first + step, ... <= start
        return self.hits + max(0, carried - expired)


# Every SET expression reads the row as it was before this statement.
_NEW_WINDOW = "flood_windows.window_start <= ?"  # the current window is over at `at`
_RECENT = "flood_windows.last_hit > ?"  # ...and its last message is within a window of `at`
_HIT = (
    "INSERT INTO flood_windows (community_id, member_key, window_start, hits, last_hit) "
    "VALUES (?, ?, ?, 1, ?) "
    "ON CONFLICT (community_id, member_key) DO UPDATE SET "
    f"hits = CASE WHEN {_NEW_WINDOW} THEN 1 ELSE flood_windows.hits + 1 END, "
    f"previous_hits = CASE WHEN {_NEW_WINDOW} THEN "
    f"(CASE WHEN {_RECENT} THEN flood_windows.hits ELSE 0 END) "
    "ELSE flood_windows.previous_hits END, "
    f"previous_first = CASE WHEN {_NEW_WINDOW} THEN flood_windows.window_start "
    "ELSE flood_windows.previous_first END, "
    f"previous_last = CASE WHEN {_NEW_WINDOW} THEN flood_windows.last_hit "
    "ELSE flood_windows.previous_last END, "
    f"window_start = CASE WHEN {_NEW_WINDOW} THEN excluded.window_start "
    "ELSE flood_windows.window_start END, "
    "last_hit = CASE WHEN flood_windows.last_hit < excluded.last_hit THEN excluded.last_hit "
    "ELSE flood_windows.last_hit END "
    "RETURNING hits, previous_hits, previous_first, previous_last"
)


class FloodStore(SqlBase):
    async def flood_hit(
        self, community_id: str, member_id: str, at: datetime, window: timedelta
    ) -> FloodCount:
        """Count one message of the member at `at`. A new window starts when the
        current one began `window` or longer before `at`; the one it replaces is kept as
        the previous window if its last message was less than `window` before `at`."""
        now, over = to_db_time(at), to_db_time(at - window)
        params = (
            community_id,
            member_key(community_id, member_id),
            now,
            now,
            *(over, over, over, over, over, over),  # _NEW_WINDOW, _RECENT, in order
        )

        def work(conn: Conn) -> FloodCount:
            row = fetchone(conn, _HIT, params)
            if row is None:  # pragma: no cover - an upsert ... RETURNING returns its row
                raise StorageError("the flood counter returned nothing")
            hits, previous, first, last = row
            return FloodCount(
                hits=int(hits),
                previous_hits=int(previous),
                previous_first=None if first is None else from_db_time(first),
                previous_last=None if last is None else from_db_time(last),
            )

        # One statement, its own transaction on both engines (see the module docstring):
        # no scope lock, so a flood check never queues behind a community's writes.
        return await self._run_outside_transaction(work)

    async def flood_warn(
        self, community_id: str, member_id: str, at: datetime, window: timedelta
    ) -> bool:
        """Claim the "slow down" notice for the member at `at`: True unless one was
        claimed less than `window` before (by any process), so a member who stays over
        the limit gets one notice per window however many processes see them."""
        params = (to_db_time(at), community_id, member_key(community_id, member_id))

        def work(conn: Conn) -> bool:
            row = fetchone(
                conn,
                "UPDATE flood_windows SET warned_at = ? WHERE community_id = ? "
                "AND member_key = ? AND (warned_at IS NULL OR warned_at <= ?) RETURNING 1",
                (*params, to_db_time(at - window)),
            )
            return row is not None

        return await self._run_outside_transaction(work)

    async def prune_flood(self, before: datetime) -> int:
        """Delete the rows whose last message was at or before `before` (nothing in them
        counts any more when `before` is now minus the window); returns how many."""
        return await self._run_write(
            lambda conn: execute(
                conn, "DELETE FROM flood_windows WHERE last_hit <= ?", (to_db_time(before),)
            ),
            scope="flood",
        )
