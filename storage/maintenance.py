"""Operations on the database file itself: the health check's query, backups, restores.

Why here: only `storage` speaks SQL, and a backup must read the schema version and the
communities' versions without migrating anything. Opening a file with
`Database.open` would run the migrations, which is exactly wrong for "back up before
you upgrade": the copy must be the file as the old release left it.

The copy is made with SQLite's online backup API (`sqlite3.Connection.backup`), not by
copying bytes: it reads a consistent snapshot through SQLite's own locking, including
whatever still sits in the `-wal` file, and writes ONE self-contained database file.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass, field
from pathlib import Path

from storage.db import Database
from storage.migrations import SCHEMA_VERSION

__all__ = [
    "SCHEMA_VERSION",
    "DatabaseFacts",
    "backup_database",
    "describe_database",
    "ping",
    "table_bytes",
]


@dataclass(frozen=True)
class DatabaseFacts:
    """What a backup manifest says about a database file (and a restore re-checks)."""

    schema_version: int
    integrity: str
    #: community id -> its newest personality version
    communities: dict[str, int] = field(default_factory=dict)


async def ping(db: Database) -> None:
    """One trivial query through the bot's own connection; raises if it cannot answer.

    It queues behind whatever the connection is doing, so a stuck writer shows up as a
    slow or failing ping, which is what a health check should see.
    """
    await db._fetchone("SELECT 1")


def backup_database(source: Path, dest: Path) -> DatabaseFacts:
    """Copy `source` into a new file `dest` with the online backup API; describe the copy.

    `dest` must not exist. The source is opened read-only: no migration, no checkpoint;
    what a crashed bot left in its `-wal` file is read through and lands in the copy.
    """
    if dest.exists():
        raise FileExistsError(dest)
    src = sqlite3.connect(f"{source.resolve().as_uri()}?mode=ro", uri=True)
    try:
        out = sqlite3.connect(dest)
        try:
            src.backup(out)
            # The copy keeps WAL mode from the source's header; a rollback-journal file
            # is ONE file that can be checked and copied without -wal/-shm companions
            # appearing beside it. `Database.open` turns WAL back on at the next start.
            out.execute("PRAGMA journal_mode=DELETE")
        finally:
            out.close()
    finally:
        src.close()
    return describe_database(dest)


def describe_database(path: Path) -> DatabaseFacts:
    """Schema version, integrity check result and each community's newest version."""
    conn = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)
    try:
        integrity = str(conn.execute("PRAGMA integrity_check").fetchone()[0])
        tables = {
            str(r[0]) for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
        }
        version = 0
        if "schema_migrations" in tables:
            row = conn.execute("SELECT COALESCE(MAX(version), 0) FROM schema_migrations").fetchone()
            version = int(row[0])
        communities: dict[str, int] = {}
        if "personality_versions" in tables:
            rows = conn.execute(
                "SELECT community_id, MAX(version) FROM personality_versions "
                "GROUP BY community_id ORDER BY community_id"
            )
            communities = {str(r[0]): int(r[1]) for r in rows}
        return DatabaseFacts(schema_version=version, integrity=integrity, communities=communities)
    finally:
        conn.close()


def table_bytes(path: Path) -> dict[str, int]:
    """Bytes each table of the database file holds, its indexes included (SQLite's
    `dbstat`), after the WAL is checkpointed from this second connection, as a backup
    tool would (what the disk-use benchmark reports)."""
    conn = sqlite3.connect(path)
    try:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        owners = dict(conn.execute("SELECT name, tbl_name FROM sqlite_master").fetchall())
        tables: dict[str, int] = {}
        for name, size in conn.execute("SELECT name, SUM(pgsize) FROM dbstat GROUP BY name"):
            table = owners.get(name, name)
            tables[table] = tables.get(table, 0) + int(size)
        return tables
    finally:
        conn.close()
