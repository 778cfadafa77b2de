"""`Database`: the bot's state, opened once per process: a SQLite file by default, or a
PostgreSQL database when DATABASE_URL is set (`open_database`; see `storage.base` for
how both run the same storage code, and `storage.postgres` for the connection pool).

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
per local day, spending limits, moderator actions, conversation buffers (`BufferStore`)
and platform plumbing (`PlatformStore`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sqlite3
from collections.abc import AsyncIterator
from datetime import UTC, date, datetime, tzinfo
from pathlib import Path
from types import TracebackType
from zoneinfo import ZoneInfo

import aiosqlite

from sonality.llm import Usage
from sonality.store import LocalLease, utcnow
from storage.base import (
    Conn,
    Engine,
    EngineName,
    SqliteEngine,
    advance_time,
    ensure_community,
    execute,
    from_db_time,
    run_on_sqlite_thread,
    to_db_time,
)
from storage.bots import BotExchangeStore
from storage.buffers import BufferStore
from storage.channels import ChannelModeStore
from storage.community import CommunityStore
from storage.coordination import LEARNING, LOCK_SPACE, Coordinator
from storage.deletion import DeletionStore
from storage.export import ExportStore
from storage.feedback import FeedbackStore
from storage.flood import FloodStore
from storage.forget import ForgetStore
from storage.history import HistoryReader
from storage.migrations import migrate
from storage.models import (
    BudgetOverride,
    CommunityInfo,
    DailyUsage,
    ModeratorAction,
    StorageError,
    UsageRole,
    UsageTotals,
)
from storage.people import PeopleStore
from storage.platform import PlatformStore
from storage.postgres import POOL_SIZE, open_postgres
from storage.removal import RemovalStore
from storage.retention import RetentionStore
from storage.spend import MemberSpendStore

log = logging.getLogger(__name__)

BUSY_TIMEOUT_MS = 5000
"""How long a write waits for another process holding the file's write lock (ms)."""


class Database(
    BufferStore,
    PlatformStore,
    PeopleStore,
    RetentionStore,
    ExportStore,
    RemovalStore,
    ForgetStore,
    DeletionStore,
    FloodStore,
    MemberSpendStore,
    FeedbackStore,
    ChannelModeStore,
    BotExchangeStore,
):
    """The open database. Create with `await Database.open(path)`; `await close()` at exit."""

    def __init__(
        self,
        engine: Engine,
        path: Path | None,
        schema_version: int,
        tz: tzinfo = UTC,
    ) -> None:
        super().__init__(engine, tz)
        self._path = path
        self.schema_version = schema_version
        # PostgreSQL: locks that let several processes share the database (who learns a
        # community, who runs a scheduled job). SQLite: None, one process per file.
        self.coordinator: Coordinator | None = None
        # SQLite: the communities' learning leases held now (see `CommunityStore`).
        self._local_leases: dict[str, LocalLease] = {}
        self._url: str | None = None  # PostgreSQL's, for `history_reader`

    def history_reader(self) -> HistoryReader:
        """How a worker process reads this database's history on its own connection."""
        if self._path is not None:
            return HistoryReader(sqlite_path=str(self._path))
        return HistoryReader(postgres_url=self._url)

    @property
    def path(self) -> Path:
        """The SQLite file (a `StorageError` on PostgreSQL, which has no file of ours)."""
        if self._path is None:
            raise StorageError("the database is PostgreSQL (DATABASE_URL): it has no file")
        return self._path

    @property
    def engine_name(self) -> EngineName:
        return self.dialect.name

    @classmethod
    async def open(cls, path: Path, timezone: str | tzinfo = "UTC") -> Database:
        """Open (creating file and parent directories), configure and migrate the database.

        `timezone` (SONALITY_TIMEZONE: an IANA name or a tzinfo) decides on which local
        day each LLM call's tokens are counted.
        """
        tz = ZoneInfo(timezone) if isinstance(timezone, str) else timezone
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
        return cls(SqliteEngine(conn), path, version, tz)

    @classmethod
    async def open_url(
        cls, url: str, timezone: str | tzinfo = "UTC", *, pool_size: int = POOL_SIZE
    ) -> Database:
        """Connect to the PostgreSQL database at `url` (``postgresql://...``) and migrate it.

        A server that cannot be reached raises `StorageError` naming the host, port and
        database, never the password.
        """
        tz = ZoneInfo(timezone) if isinstance(timezone, str) else timezone
        engine = await asyncio.to_thread(open_postgres, url, pool_size)
        try:
            version = await migrate(engine)
        except BaseException:
            await engine.close()
            raise
        log.debug("opened PostgreSQL at %s (schema v%d)", engine.where, version)
        db = cls(engine, None, version, tz)
        db.coordinator = Coordinator(url)
        db._url = url
        return db

    async def close(self) -> None:
        """Close the connection(s); operations already handed over finish first.

        From the first call on, new operations raise `StorageError`; aiosqlite queues the
        close behind every transaction already handed to its thread, and the PostgreSQL
        engine waits for the transactions its threads are running, so none is cut off.
        """
        async with self._close_lock:
            if self._closed:
                return
            self._closed = True
            if self.coordinator is not None:
                await self.coordinator.close()
            await self._engine.close()

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
        return CommunityStore(self, community_id, self.coordinator, self._local_leases)

    @contextlib.asynccontextmanager
    async def job_run(self, name: str) -> AsyncIterator[bool]:
        """Yield whether this process runs this run of the scheduled job `name`.

        With several processes on one PostgreSQL database, only the one that gets the
        job's lock runs it and the others skip that run; on SQLite (one process) always.
        """
        if self.coordinator is None:
            yield True
            return
        async with self.coordinator.job(name) as mine:
            yield mine

    async def communities_waiting_to_learn(self, older_than: datetime) -> list[str]:
        """Communities with an interaction answered before `older_than` and still not
        learned, and whose learning lease nobody holds: with several processes, ones whose
        learner died (see `bot.scheduler`). A community being learned is left out, so the
        sweep does not load its agent into every other process only to be refused."""
        held = ""
        if self.dialect.postgres:
            held = (
                " AND NOT EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory' "
                f"AND classid = {LOCK_SPACE}::oid AND objsubid = 2 "
                f"AND objid = hashtext('{LEARNING}' || community_id)::oid)"
            )
        rows = await self._fetchall(
            "SELECT DISTINCT community_id FROM interactions "
            f"WHERE status = 'pending' AND created_at < ?{held} ORDER BY community_id",
            (to_db_time(older_than),),
        )
        return [str(r[0]) for r in rows]

    # --- communities ---------------------------------------------------------------------

    async def touch_community(
        self, community_id: str, name: str = "", at: datetime | None = None
    ) -> None:
        """Note activity in a community (creating its row), and its latest display name."""
        at = at or utcnow()

        def work(conn: Conn) -> None:
            advance_time(conn, community_id, "last_activity_at", at)
            if name:
                execute(conn, "UPDATE communities SET name = ? WHERE id = ?", (name, community_id))

        await self._run_write(work, scope=community_id)

    async def communities_needing_nightly(self) -> list[str]:
        """Communities with activity after their last reflection (or never reflected).

        Quiet communities are skipped so the nightly job spends no tokens on them, and so
        are those the bot was removed from (their data only waits for erasure), whichever
        process heard of the removal.
        """
        rows = await self._fetchall(
            "SELECT id FROM communities WHERE last_activity_at IS NOT NULL "
            "AND (last_reflection_time IS NULL OR last_activity_at > last_reflection_time) "
            "AND id NOT IN (SELECT community_id FROM community_removals) "
            "ORDER BY id"
        )
        return [str(r[0]) for r in rows]

    async def mark_reflected(self, community_id: str, at: datetime) -> None:
        """Record a finished reflection (never moves the time backwards)."""
        await self._run_write(
            lambda conn: advance_time(conn, community_id, "last_reflection_time", at),
            scope=community_id,
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

    async def usage_totals(
        self, community_id: str, first: date | None = None, last: date | None = None
    ) -> UsageTotals:
        """Summed token usage of one community, overall and per role, over the local days
        `first`..`last` (both included; either left out: unbounded)."""
        return _totals(await self.usage_days(community_id, first, last))

    async def usage_days(
        self, community_id: str, first: date | None = None, last: date | None = None
    ) -> list[DailyUsage]:
        """The daily rollup rows of one community over the local days `first`..`last`
        (both included; either left out: unbounded), oldest day first."""
        sql = (
            "SELECT day, role, model, calls, input_tokens, output_tokens, "
            "cache_write_tokens, cache_read_tokens FROM usage_daily WHERE community_id = ?"
        )
        params: list[object] = [community_id]
        if first is not None:
            sql += " AND day >= ?"
            params.append(first.isoformat())
        if last is not None:
            sql += " AND day <= ?"
            params.append(last.isoformat())
        rows = await self._fetchall(sql + " ORDER BY day, role, model", params)
        return [
            DailyUsage(
                day=date.fromisoformat(r[0]),
                role=r[1],
                model=r[2],
                calls=r[3],
                usage=Usage(
                    input_tokens=r[4],
                    output_tokens=r[5],
                    cache_write_tokens=r[6],
                    cache_read_tokens=r[7],
                ),
            )
            for r in rows
        ]

    # --- spending limits -----------------------------------------------------------------

    async def budget_override(self, community_id: str) -> BudgetOverride | None:
        """The community's own daily limit, or None when it follows the default."""
        row = await self._fetchone(
            "SELECT daily_limit_usd, set_by, set_at FROM community_budgets WHERE community_id = ?",
            (community_id,),
        )
        if row is None:
            return None
        return BudgetOverride(
            community_id=community_id,
            daily_limit_usd=None if row[0] is None else float(row[0]),
            set_by=row[1],
            set_at=from_db_time(row[2]),
        )

    async def set_budget_override(
        self,
        community_id: str,
        daily_limit_usd: float | None,
        *,
        set_by: str,
        at: datetime | None = None,
    ) -> None:
        """Give the community its own daily limit (None: explicitly no limit)."""
        at = at or utcnow()
        params = (community_id, daily_limit_usd, set_by, to_db_time(at))

        def work(conn: Conn) -> None:
            ensure_community(conn, community_id, at)
            execute(
                conn,
                "INSERT INTO community_budgets (community_id, daily_limit_usd, set_by, set_at) "
                "VALUES (?, ?, ?, ?) ON CONFLICT (community_id) DO UPDATE SET "
                "daily_limit_usd = excluded.daily_limit_usd, set_by = excluded.set_by, "
                "set_at = excluded.set_at",
                params,
            )

        await self._run_write(work, scope=community_id)

    async def clear_budget_override(self, community_id: str) -> None:
        """Make the community follow the default limit again."""
        await self._run_write(
            lambda conn: execute(
                conn, "DELETE FROM community_budgets WHERE community_id = ?", (community_id,)
            ),
            scope=community_id,
        )

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

        def work(conn: Conn) -> None:
            ensure_community(conn, community_id, at)
            execute(
                conn,
                "INSERT INTO moderator_actions (community_id, actor_id, actor_name, action, "
                "args, reason, allowed, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                params,
            )

        await self._run_write(work, scope=community_id)

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


def _totals(rows: list[DailyUsage]) -> UsageTotals:
    total = Usage()
    calls = 0
    by_role: dict[UsageRole, Usage] = {}
    for row in rows:
        by_role[row.role] = by_role.get(row.role, Usage()) + row.usage
        total = total + row.usage
        calls += row.calls
    return UsageTotals(usage=total, calls=calls, by_role=by_role)


def _configure(conn: sqlite3.Connection, path: Path) -> None:
    """WAL, foreign keys, busy timeout, synchronous=NORMAL (see the module docstring)."""
    row = conn.execute("PRAGMA journal_mode=WAL").fetchone()
    mode = str(row[0]).lower() if row else ""
    if mode != "wal":
        raise StorageError(f"could not enable WAL mode on {path} (got {mode!r})")
    conn.execute("PRAGMA foreign_keys=ON")
    conn.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
    conn.execute("PRAGMA synchronous=NORMAL")
    # Deleted rows (erased communities, replaced Slack tokens, forgotten members) are
    # overwritten with zeros instead of lingering in free pages of the file.
    conn.execute("PRAGMA secure_delete=ON")


async def open_database(*, url: str | None, path: Path, timezone: str | tzinfo = "UTC") -> Database:
    """The bot's database as configured: PostgreSQL at `url` (DATABASE_URL) when one is
    given, else the SQLite file at `path`."""
    if url:
        return await Database.open_url(url, timezone=timezone)
    return await Database.open(path, timezone=timezone)
