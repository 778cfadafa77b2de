"""When the bot is removed from a community: a grace period, then every row erased.

Why a grace period at all: a guild owner who kicks the bot by mistake, or a Slack admin
who reinstalls the app, expects the personality back as it was. A community that
really left expects its members' words gone. So removal only records a deadline
(`mark_removed`); adding the bot back before it cancels the erasure (`mark_returned`),
and after it the community starts again from the seed.

Why erasure needs its own door: `personality_versions` is append-only, enforced by a
trigger, because history is evidence. The one exception is erasing a whole community,
and it goes through `community_erasures`: the trigger lets a version row be deleted
only while an unfinished erasure of that same community exists. `erase_community`
opens that row, deletes, and closes it with the count, all in ONE transaction, so no
other writer ever sees the gate open, and the closed row stays as the audit record of
what was erased and when (it names the community, never a member).

Which tables: every table with a ``community_id`` column, found in the schema at run
time, so a table added by a later migration is erased too without anyone remembering
to list it here. Foreign keys are checked at commit (``defer_foreign_keys``), so the
order of the deletes does not matter.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Literal

from storage.base import (
    Conn,
    SqlBase,
    execute,
    fetchall,
    fetchone,
    insert_returning_id,
    platform_of,
    to_db_time,
)

# Kept by an erasure: the removal list is handled explicitly, the erasure log is the audit.
_NOT_ERASED = frozenset({"community_removals", "community_erasures"})
# Deleted last, in this order, after every table that may refer to them.
_LAST = ("personality_versions", "communities")

Return = Literal["kept", "erased", "not-removed"]


@dataclass(frozen=True)
class Removal:
    community_id: str
    removed_at: datetime
    delete_at: datetime


def _community_tables(conn: Conn) -> list[str]:
    """Every table holding per-community rows, `_LAST` at the end."""
    if conn.dialect.postgres:
        names = [
            str(r[0])
            for r in fetchall(
                conn,
                "SELECT table_name FROM information_schema.tables "
                "WHERE table_schema = current_schema() AND table_type = 'BASE TABLE' "
                "ORDER BY table_name",
            )
        ]
    else:
        names = [
            str(r[0])
            for r in fetchall(
                conn,
                "SELECT name FROM sqlite_master WHERE type = 'table' "
                "AND name NOT LIKE 'sqlite_%' ORDER BY name",
            )
        ]
    tables = []
    for name in names:
        if name in _NOT_ERASED or name in _LAST:
            continue
        if "community_id" in _columns(conn, name):
            tables.append(name)
    return tables + [t for t in _LAST if t in names]


def _columns(conn: Conn, table: str) -> set[str]:
    if conn.dialect.postgres:
        rows = fetchall(
            conn,
            "SELECT column_name FROM information_schema.columns "
            "WHERE table_schema = current_schema() AND table_name = ?",
            (table,),
        )
        return {str(r[0]) for r in rows}
    return {str(c[1]) for c in fetchall(conn, f'PRAGMA table_info("{table}")')}


def erase_in_transaction(conn: Conn, community_id: str, at: datetime) -> int:
    """Delete every row of `community_id` (inside the caller's write transaction);
    returns the number of rows deleted. See the module docstring for the gate."""
    removal = fetchone(
        conn, "SELECT removed_at FROM community_removals WHERE community_id = ?", (community_id,)
    )
    stamp = to_db_time(at)
    if conn.dialect.postgres:
        # Only constraints declared DEFERRABLE are deferred; the order of `_LAST` (rows
        # that others refer to go last) is what makes the deletes valid there.
        execute(conn, "SET CONSTRAINTS ALL DEFERRED")
    else:
        execute(conn, "PRAGMA defer_foreign_keys = ON")
    erasure_id = insert_returning_id(
        conn,
        "INSERT INTO community_erasures (community_id, removed_at, started_at) VALUES (?, ?, ?)",
        (community_id, removal[0] if removal else None, stamp),
    )
    deleted = 0
    for table in _community_tables(conn):
        column = "id" if table == "communities" else "community_id"
        deleted += execute(conn, f'DELETE FROM "{table}" WHERE "{column}" = ?', (community_id,))
    if platform_of(community_id) == "slack":
        # The workspace's bot (and user) tokens: "slack:T042" is team T042 (or, for an
        # org-wide install, enterprise E…).
        native = community_id.partition(":")[2]
        deleted += execute(
            conn,
            "DELETE FROM installations WHERE team_id = ? OR (team_id = '' AND enterprise_id = ?)",
            (native, native),
        )
    execute(conn, "DELETE FROM community_removals WHERE community_id = ?", (community_id,))
    execute(
        conn,
        "UPDATE community_erasures SET finished_at = ?, rows_deleted = ? WHERE id = ?",
        (stamp, deleted, erasure_id),
    )
    return deleted


class RemovalStore(SqlBase):
    async def mark_removed(self, community_id: str, at: datetime, keep_for: timedelta) -> Removal:
        """Note that the bot was removed at `at`; erase at `at + keep_for`.

        A second removal event for a community already removed (Slack sends both
        ``tokens_revoked`` and ``app_uninstalled``; a shard may replay GUILD_DELETE)
        keeps the first deadline: the clock does not restart.
        """

        def work(conn: Conn) -> Removal:
            execute(
                conn,
                "INSERT INTO community_removals (community_id, removed_at, delete_at) "
                "VALUES (?, ?, ?) ON CONFLICT DO NOTHING",
                (community_id, to_db_time(at), to_db_time(at + keep_for)),
            )
            row = fetchone(
                conn,
                "SELECT removed_at, delete_at FROM community_removals WHERE community_id = ?",
                (community_id,),
            )
            assert row is not None
            return Removal(
                community_id, datetime.fromisoformat(row[0]), datetime.fromisoformat(row[1])
            )

        return await self._run_write(work, scope=community_id)

    async def mark_returned(self, community_id: str, at: datetime) -> Return:
        """The bot was added back at `at`. Before the deadline the removal is cancelled
        ("kept"); at or after it the community is erased now if housekeeping has not
        done it yet ("erased"), so it starts from the seed either way."""
        stamp = to_db_time(at)

        def work(conn: Conn) -> Return:
            row = fetchone(
                conn,
                "SELECT delete_at FROM community_removals WHERE community_id = ?",
                (community_id,),
            )
            if row is None:
                return "not-removed"
            if str(row[0]) <= stamp:
                erase_in_transaction(conn, community_id, at)
                return "erased"
            execute(conn, "DELETE FROM community_removals WHERE community_id = ?", (community_id,))
            return "kept"

        outcome = await self._run_write(work, scope=community_id)
        if outcome == "erased":
            await self.truncate_wal()
        return outcome

    async def removals(self) -> list[Removal]:
        rows = await self._fetchall(
            "SELECT community_id, removed_at, delete_at FROM community_removals ORDER BY delete_at"
        )
        return [
            Removal(str(r[0]), datetime.fromisoformat(r[1]), datetime.fromisoformat(r[2]))
            for r in rows
        ]

    async def due_erasures(self, now: datetime) -> list[str]:
        """Removed communities whose grace period is over at `now`."""
        rows = await self._fetchall(
            "SELECT community_id FROM community_removals WHERE delete_at <= ? ORDER BY delete_at",
            (to_db_time(now),),
        )
        return [str(r[0]) for r in rows]

    async def erase_community(self, community_id: str, at: datetime) -> int:
        """Delete every SQLite row of `community_id` now, in one transaction; returns the
        rows deleted. Chroma and in-memory state are the caller's (bot/) to clear."""
        deleted = await self._run_write(
            lambda conn: erase_in_transaction(conn, community_id, at), scope=community_id
        )
        await self.truncate_wal()
        return deleted

    async def truncate_wal(self) -> None:
        """After an erasure: SQLite copies the WAL into the file and empties it (the WAL
        still holds the pages as they were before the delete; secure_delete zeroes the
        file's pages, not old frames); PostgreSQL vacuums the erased tables."""
        tables = await self._run_read(_community_tables)
        await self._scrub_deleted(tables, rebuild=False)

    async def erasures(self, community_id: str) -> list[tuple[str, str | None, int | None]]:
        """The audit record: (started_at, finished_at, rows_deleted) per erasure."""
        rows = await self._fetchall(
            "SELECT started_at, finished_at, rows_deleted FROM community_erasures "
            "WHERE community_id = ? ORDER BY id",
            (community_id,),
        )
        return [(str(r[0]), r[1], r[2]) for r in rows]
