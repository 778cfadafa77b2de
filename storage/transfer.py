"""Copying a SQLite installation's state into PostgreSQL (`python -m app migrate`).

Why a copy of rows and not a dump: the two engines share one schema by name (see
`storage.migrations`), so the target is migrated to the current schema by the bot's own
migrations first, and then every table is copied column by column, with its original
ids, times and text. Nothing is re-derived: a version's ``state_json`` (a keyframe or a
merge patch), an installation's encrypted JSON and the evidence log arrive byte for
byte, so the same SONALITY_SECRET_KEY opens the same installations afterwards.

Why the append-only triggers need no switching off: they refuse UPDATE and DELETE of
``personality_versions``, and the copy only inserts. The one trigger that checks
inserts (a patch must extend its keyframe's chain) is satisfied by copying each
community's versions in version order. So the guarantees hold during the copy too.

Why re-running works: a small table, ``sonality_transfer``, is created on the target
when a copy starts and dropped when the copy has been checked. While it exists, a new
run of the same copy writes every row again as an upsert (history rows, which may not
be updated, are skipped when present), so a copy cut off at any batch is finished by
running the command again. A target holding data without that marker is refused: it is
some other bot's state, and a copy must never mix into it.

Each batch of rows is one PostgreSQL transaction; the copy ends with a check that every
table holds as many rows as the source, and that every community's newest version is
the same row on both sides.
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from storage.base import first_line
from storage.db import Database
from storage.models import StorageError
from storage.postgres import CONNECT_TIMEOUT_S, connect_error, describe_url

MARKER = "sonality_transfer"
"""The target's table saying a copy into it is under way (dropped once it is checked)."""

BATCH_ROWS = 1000
"""Rows per PostgreSQL transaction: small enough that a failure repeats little work."""

HISTORY = "personality_versions"
"""Append-only: rows already copied are left as they are (the trigger refuses updates)."""

_SKIPPED = ("schema_migrations", "sqlite_sequence", MARKER)


class TransferRefused(StorageError):
    """The copy did not start: the target holds another installation's data, or the
    source is not what a copy can read. The message is the one line to print."""


class TransferMismatch(StorageError):
    """The copy ran but the check afterwards found the two sides differ."""


@dataclass
class TableCopy:
    """How one table went: rows in the source, and rows found in the target after."""

    name: str
    rows: int
    target_rows: int = 0


@dataclass
class TransferReport:
    """What was copied, for the command's printout and for tests."""

    resumed: bool
    tables: list[TableCopy] = field(default_factory=list)
    communities: int = 0
    newest_versions: dict[str, int] = field(default_factory=dict)

    @property
    def rows(self) -> int:
        return sum(t.rows for t in self.tables)


# --------------------------------------------------------------------------- the source


def _open_source(path: Path) -> sqlite3.Connection:
    if not path.is_file():
        raise TransferRefused(f"there is no database at {path}: nothing to migrate")
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    conn.execute("PRAGMA query_only=ON")
    return conn


def _tables(source: sqlite3.Connection) -> list[str]:
    """The source's tables, each after the tables its foreign keys point at."""
    names = [
        str(row[0])
        for row in source.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
        if not str(row[0]).startswith("sqlite_") and row[0] not in _SKIPPED
    ]
    parents = {
        name: {str(fk[2]) for fk in source.execute(f'PRAGMA foreign_key_list("{name}")')}
        for name in names
    }
    ordered: list[str] = []

    def visit(name: str, seen: frozenset[str]) -> None:
        if name in ordered or name in seen:
            return
        for parent in sorted(parents.get(name, ())):
            if parent in parents:
                visit(parent, seen | {name})
        ordered.append(name)

    for name in sorted(names):
        visit(name, frozenset())
    return ordered


def _columns(source: sqlite3.Connection, table: str) -> tuple[list[str], list[str]]:
    """(every column, the primary key's columns in key order)."""
    info = list(source.execute(f'PRAGMA table_info("{table}")'))
    columns = [str(r[1]) for r in info]
    key = [str(r[1]) for r in sorted((r for r in info if r[5]), key=lambda r: r[5])]
    return columns, key


def _rows(
    source: sqlite3.Connection, table: str, columns: Sequence[str], key: Sequence[str]
) -> Iterator[list[tuple[Any, ...]]]:
    names = ", ".join(f'"{c}"' for c in columns)
    # Key order: each community's versions in version order, as the chain trigger needs.
    order = ", ".join(f'"{c}"' for c in key) or "rowid"
    cur = source.execute(f'SELECT {names} FROM "{table}" ORDER BY {order}')
    while batch := cur.fetchmany(BATCH_ROWS):
        yield [tuple(row) for row in batch]


def _next_ids(source: sqlite3.Connection) -> dict[str, int]:
    """Each AUTOINCREMENT table's highest id ever handed out (deleted rows' too), so the
    target never hands one out again."""
    found = source.execute(
        "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'sqlite_sequence'"
    ).fetchone()
    if not found:
        return {}
    return {
        str(name): int(seq) for name, seq in source.execute("SELECT name, seq FROM sqlite_sequence")
    }


# --------------------------------------------------------------------------- the target


async def prepare(source_path: Path, url: str) -> None:
    """Bring both sides to this release's schema with the bot's own migrations: the
    source as the bot's next start would (an older file is upgraded in place), the
    target from nothing."""
    if not await asyncio.to_thread(source_path.is_file):  # open() would create one
        raise TransferRefused(f"there is no database at {source_path}: nothing to migrate")
    db = await Database.open(source_path)
    await db.close()
    db = await Database.open_url(url, pool_size=1)
    await db.close()


def _connect(url: str) -> Any:
    import psycopg

    try:
        return psycopg.connect(url, connect_timeout=CONNECT_TIMEOUT_S)
    except psycopg.Error as exc:
        raise connect_error(url, exc) from None


def _target_has_rows(target: Any, tables: Sequence[str]) -> str | None:
    """The first of `tables` holding a row on the target (None: all empty)."""
    for table in tables:
        if target.execute(f'SELECT 1 FROM "{table}" LIMIT 1').fetchone():
            return table
    return None


def _marker(target: Any) -> tuple[str, str] | None:
    exists = target.execute("SELECT to_regclass(%s) IS NOT NULL", (MARKER,)).fetchone()
    if not exists or not exists[0]:
        return None
    row = target.execute(f"SELECT source, started_at FROM {MARKER}").fetchone()
    return None if row is None else (str(row[0]), str(row[1]))


def begin(source_path: Path, url: str) -> bool:
    """Claim the (already migrated) target for this copy; True when it resumes one.

    Refuses a target that holds data unless it is this same source's unfinished copy.
    """
    source = _open_source(source_path)
    try:
        tables = _tables(source)
    finally:
        source.close()
    where = describe_url(url)
    with _connect(url) as target:
        found = _marker(target)
        if found is not None:
            if found[0] != str(source_path.resolve()):
                raise TransferRefused(
                    f"PostgreSQL at {where} holds an unfinished copy of another database "
                    f"({found[0]}, started {found[1]}); finish that one or use an empty database"
                )
            return True
        holder = _target_has_rows(target, tables)
        if holder is not None:
            raise TransferRefused(
                f"PostgreSQL at {where} already holds data (table {holder} has rows); "
                "migrate only into an empty database"
            )
        with target.transaction():
            target.execute(
                f"CREATE TABLE {MARKER} (source TEXT NOT NULL, started_at TEXT NOT NULL)"
            )
            target.execute(
                f"INSERT INTO {MARKER} (source, started_at) VALUES (%s, %s)",
                (str(source_path.resolve()), datetime.now(UTC).isoformat(timespec="seconds")),
            )
    return False


def copy_tables(
    source_path: Path, url: str, on_table: Callable[[TableCopy], None] | None = None
) -> list[TableCopy]:
    """Copy every table, one transaction per batch of `BATCH_ROWS` rows; then move each
    identity column's counter past the highest id the source ever used."""
    import psycopg

    source = _open_source(source_path)
    copies: list[TableCopy] = []
    try:
        with _connect(url) as target:
            target_columns = _target_columns(target)
            for table in _tables(source):
                if table not in target_columns:
                    raise TransferRefused(
                        f"the source has a table {table} the target's schema lacks; "
                        "run the same release of the bot on both sides"
                    )
                columns, key = _columns(source, table)
                sql = _insert_sql(table, columns, key)
                copied = 0
                for batch in _rows(source, table, columns, key):
                    try:
                        with target.transaction(), target.cursor() as cur:
                            cur.executemany(sql, batch)
                    except psycopg.Error as exc:  # e.g. a NUL character PostgreSQL refuses
                        raise StorageError(
                            f"copying table {table} failed after {copied} rows "
                            f"({first_line(exc)}); nothing of that batch was written"
                        ) from exc
                    copied += len(batch)
                done = TableCopy(table, copied)
                copies.append(done)
                if on_table is not None:
                    on_table(done)
            _advance_identities(target, _next_ids(source))
    finally:
        source.close()
    return copies


def _target_columns(target: Any) -> dict[str, set[str]]:
    found: dict[str, set[str]] = {}
    for table, column in target.execute(
        "SELECT table_name, column_name FROM information_schema.columns "
        "WHERE table_schema = current_schema()"
    ):
        found.setdefault(str(table), set()).add(str(column))
    return found


def _insert_sql(table: str, columns: Sequence[str], key: Sequence[str]) -> str:
    names = ", ".join(f'"{c}"' for c in columns)
    values = ", ".join(["%s"] * len(columns))
    sql = f'INSERT INTO "{table}" ({names}) VALUES ({values})'
    rest = [c for c in columns if c not in key]
    if not key:
        return sql
    conflict = ", ".join(f'"{c}"' for c in key)
    if table == HISTORY or not rest:
        return f"{sql} ON CONFLICT ({conflict}) DO NOTHING"
    updates = ", ".join(f'"{c}" = excluded."{c}"' for c in rest)
    return f"{sql} ON CONFLICT ({conflict}) DO UPDATE SET {updates}"


def _advance_identities(target: Any, used: dict[str, int]) -> None:
    identities = target.execute(
        "SELECT table_name, column_name FROM information_schema.columns "
        "WHERE table_schema = current_schema() AND is_identity = 'YES'"
    ).fetchall()
    with target.transaction():
        for table, column in identities:
            top = target.execute(f'SELECT COALESCE(MAX("{column}"), 0) FROM "{table}"').fetchone()
            highest = max(int(top[0]) if top else 0, used.get(str(table), 0))
            if highest > 0:
                target.execute(
                    "SELECT setval(pg_get_serial_sequence(%s, %s), %s)",
                    (f'"{table}"', column, highest),
                )


def check(source_path: Path, url: str, copies: list[TableCopy], resumed: bool) -> TransferReport:
    """Compare both sides: row counts per table, and every community's newest version
    (number and content). Raises `TransferMismatch` naming the first difference."""
    report = TransferReport(resumed=resumed, tables=copies)
    source = _open_source(source_path)
    try:
        with _connect(url) as target:
            for copy in copies:
                row = target.execute(f'SELECT COUNT(*) FROM "{copy.name}"').fetchone()
                copy.target_rows = int(row[0]) if row else 0
                if copy.target_rows != copy.rows:
                    raise TransferMismatch(
                        f"table {copy.name}: {copy.rows} rows in the source but "
                        f"{copy.target_rows} in the target"
                    )
            newest = (
                "SELECT v.community_id, v.version, v.cause, v.state_json, v.created_at "
                "FROM personality_versions v JOIN (SELECT community_id, MAX(version) AS top "
                "FROM personality_versions GROUP BY community_id) m "
                "ON v.community_id = m.community_id AND v.version = m.top ORDER BY 1"
            )
            mine = [tuple(r) for r in source.execute(newest)]
            theirs = [tuple(r) for r in target.execute(newest)]
            if mine != theirs:
                first = next(
                    (a[0] for a, b in zip(mine, theirs, strict=False) if a != b),
                    "(a community missing on one side)",
                )
                raise TransferMismatch(f"the newest version of {first} differs after the copy")
            report.newest_versions = {str(r[0]): int(r[1]) for r in mine}
            count = source.execute("SELECT COUNT(*) FROM communities").fetchone()
            report.communities = int(count[0]) if count else 0
    finally:
        source.close()
    return report


def finish(url: str) -> None:
    """The copy is checked: drop the marker, so the target is an ordinary database."""
    with _connect(url) as target, target.transaction():
        target.execute(f"DROP TABLE IF EXISTS {MARKER}")
