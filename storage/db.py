"""`Database`: the bot's single SQLite file, opened once per process.

Why SQLite in WAL mode with one connection: the bot is one process serving many
communities; WAL lets readers (the sqlite3 shell, a backup) work while the bot writes,
`synchronous=NORMAL` keeps commits cheap (in WAL mode a committed transaction survives a
process crash; only an OS crash/power loss can lose the last few), and a single
connection whose every operation is one transaction run as one call in aiosqlite's
worker thread (see `storage.base`) gives every group of related writes exactly one
transaction without any cross-connection locking surprises.

Per-community data is reached through `Database.community(id)` (a `CommunityStore`,
the engine's `StateStore`); the methods here cover what spans communities or belongs to
the bot rather than the engine: community bookkeeping for the scheduler, token usage
totals, moderator actions, conversation buffers (`BufferStore`) and platform plumbing
(`PlatformStore`).
"""

from __future__ import annotations

import logging
import sqlite3
from datetime import datetime
from pathlib import Path
from types import TracebackType

import aiosqlite

from sonality.llm import Usage
from sonality.store import utcnow
from storage.base import (
    advance_time,
    ensure_community,
    execute,
    from_db_time,
    run_on_sqlite_thread,
    to_db_time,
)
from storage.buffers import BufferStore
from storage.community import CommunityStore
from storage.migrations import migrate
from storage.models import CommunityInfo, ModeratorAction, StorageError, UsageTotals
from storage.platform import PlatformStore

log = logging.getLogger(__name__)

BUSY_TIMEOUT_MS = 5000
"""How long a write waits for another process holding the file's write lock (ms)."""


class Database(BufferStore, PlatformStore):
    """The open database. Create with `await Database.open(path)`; `await close()` at exit."""

    def __init__(self, conn: aiosqlite.Connection, path: Path, schema_version: int) -> None:
        super().__init__(conn)
        self.path = path
        self.schema_version = schema_version

    @classmethod
    async def open(cls, path: Path) -> Database:
        """Open (creating file and parent directories), configure and migrate the database."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        # isolation_level=None: no implicit transactions; storage issues BEGIN/COMMIT itself.
        conn = await aiosqlite.connect(path, isolation_level=None)
        try:
            await run_on_sqlite_thread(conn, lambda c: _configure(c, path))
            version = await migrate(conn)
        except BaseException:
            await conn.close()
            raise
        log.debug("opened %s (schema v%d)", path, version)
        return cls(conn, path, version)

    async def close(self) -> None:
        """Close the connection; operations already queued finish first.

        From the first call on, new operations raise `StorageError`; aiosqlite queues the
        close behind every transaction already handed to its thread, so none is cut off.
        """
        async with self._close_lock:
            if self._closed:
                return
            self._closed = True
            await self._conn.close()

    async def __aenter__(self) -> Database:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    def community(self, community_id: str) -> CommunityStore:
        """The `StateStore` of one community (cheap; no I/O until used)."""
        return CommunityStore(self, community_id)

    # --- communities ---------------------------------------------------------------------

    async def touch_community(
        self, community_id: str, name: str = "", at: datetime | None = None
    ) -> None:
        """Note activity in a community (creating its row), and its latest display name."""
        at = at or utcnow()

        def work(conn: sqlite3.Connection) -> None:
            advance_time(conn, community_id, "last_activity_at", at)
            if name:
                execute(conn, "UPDATE communities SET name = ? WHERE id = ?", (name, community_id))

        await self._run_write(work)

    async def communities_needing_nightly(self) -> list[str]:
        """Communities with activity after their last reflection (or never reflected).

        Quiet communities are skipped so the nightly job spends no tokens on them.
        """
        rows = await self._fetchall(
            "SELECT id FROM communities WHERE last_activity_at IS NOT NULL "
            "AND (last_reflection_time IS NULL OR last_activity_at > last_reflection_time) "
            "ORDER BY id"
        )
        return [str(r[0]) for r in rows]

    async def mark_reflected(self, community_id: str, at: datetime) -> None:
        """Record a finished reflection (never moves the time backwards)."""
        await self._run_write(
            lambda conn: advance_time(conn, community_id, "last_reflection_time", at)
        )

    async def community_ids(self) -> list[str]:
        rows = await self._fetchall("SELECT id FROM communities ORDER BY id")
        return [str(r[0]) for r in rows]

    async def community_info(self, community_id: str) -> CommunityInfo | None:
        row = await self._fetchone(
            "SELECT id, platform, name, created_at, last_activity_at, last_reflection_time "
            "FROM communities WHERE id = ?",
            (community_id,),
        )
        if row is None:
            return None
        return CommunityInfo(
            id=row[0],
            platform=row[1],
            name=row[2],
            created_at=from_db_time(row[3]),
            last_activity_at=from_db_time(row[4]) if row[4] else None,
            last_reflection_time=from_db_time(row[5]) if row[5] else None,
        )

    # --- token usage ---------------------------------------------------------------------

    async def usage_totals(self, community_id: str) -> UsageTotals:
        """Summed token usage of one community, overall and per purpose."""
        rows = await self._fetchall(
            "SELECT purpose, COUNT(*), SUM(input_tokens), SUM(output_tokens), "
            "SUM(cache_read_tokens), SUM(cache_write_tokens) FROM token_usage "
            "WHERE community_id = ? GROUP BY purpose ORDER BY purpose",
            (community_id,),
        )
        total = Usage()
        calls = 0
        by_purpose: dict[str, Usage] = {}
        for purpose, count, inp, out, cread, cwrite in rows:
            usage = Usage(
                input_tokens=int(inp or 0),
                output_tokens=int(out or 0),
                cache_read_tokens=int(cread or 0),
                cache_write_tokens=int(cwrite or 0),
            )
            by_purpose[str(purpose)] = usage
            total = total + usage
            calls += int(count)
        return UsageTotals(usage=total, calls=calls, by_purpose=by_purpose)

    # --- moderator actions ---------------------------------------------------------------

    async def record_moderator_action(
        self,
        community_id: str,
        *,
        actor_id: str,
        actor_name: str,
        action: str,
        allowed: bool,
        args: str = "",
        reason: str = "",
        at: datetime | None = None,
    ) -> None:
        """Log a moderator command attempt, including refused ones (allowed=False).

        Why the caller records this and `CommunityStore.commit` doesn't: refusals and
        failed attempts have no state commit, and only the command layer knows the
        actor's display name, the arguments and the reason. A rollback's version row
        still carries `actor`, so the history is complete even if this write is lost.
        """
        at = at or utcnow()
        params = (
            community_id,
            actor_id,
            actor_name,
            action,
            args,
            reason,
            int(allowed),
            to_db_time(at),
        )

        def work(conn: sqlite3.Connection) -> None:
            ensure_community(conn, community_id, at)
            execute(
                conn,
                "INSERT INTO moderator_actions (community_id, actor_id, actor_name, action, "
                "args, reason, allowed, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                params,
            )

        await self._run_write(work)

    async def moderator_actions(self, community_id: str, limit: int = 20) -> list[ModeratorAction]:
        """Newest first."""
        rows = await self._fetchall(
            "SELECT actor_id, actor_name, action, args, reason, allowed, created_at "
            "FROM moderator_actions WHERE community_id = ? ORDER BY id DESC LIMIT ?",
            (community_id, max(0, limit)),
        )
        return [
            ModeratorAction(
                community_id=community_id,
                actor_id=r[0],
                actor_name=r[1],
                action=r[2],
                args=r[3],
                reason=r[4],
                allowed=bool(r[5]),
                created_at=from_db_time(r[6]),
            )
            for r in rows
        ]


def _configure(conn: sqlite3.Connection, path: Path) -> None:
    """WAL, foreign keys, busy timeout, synchronous=NORMAL (see the module docstring)."""
    row = conn.execute("PRAGMA journal_mode=WAL").fetchone()
    mode = str(row[0]).lower() if row else ""
    if mode != "wal":
        raise StorageError(f"could not enable WAL mode on {path} (got {mode!r})")
    conn.execute("PRAGMA foreign_keys=ON")
    conn.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
    conn.execute("PRAGMA synchronous=NORMAL")
