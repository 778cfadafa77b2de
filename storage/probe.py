"""Read-only checks of SQLite files, run at start before anything opens them for writing.

Why: `Database.open` (and Chroma) would meet a damaged or foreign file only by failing
part-way, with a traceback, and a read-only file only when the first member writes. The
start-up check asks here first. Nothing in this module ever writes: a file is read
through its bytes or through a connection SQLite itself keeps from writing
(``immutable=1``, or ``mode=ro`` when a write-ahead log is present), so the operator's
evidence stays exactly as it was.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import struct
from collections.abc import Iterator
from pathlib import Path

from storage.migrations import MIGRATIONS
from storage.models import SchemaTooNewError, StorageError

SQLITE_MAGIC = b"SQLite format 3\x00"
HEADER_BYTES = 100


def probe_sqlite_file(path: Path) -> None:
    """Raise `StorageError` (worded for one line) if `path` is not a whole SQLite file.

    Checks the header's magic and page size, that the file holds every page its header
    counts (a copy cut short), and that SQLite can read the schema.
    """
    _check_header(path)
    with _read_only(path) as conn:
        try:
            conn.execute("SELECT count(*) FROM sqlite_master").fetchone()
        except sqlite3.DatabaseError as exc:
            raise StorageError(f"{path} is damaged ({exc})") from None


def probe_database(path: Path) -> None:
    """`probe_sqlite_file`, and a `SchemaTooNewError` when a newer bot has migrated it."""
    probe_sqlite_file(path)
    with _read_only(path) as conn:
        try:
            has_table = conn.execute(
                "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'schema_migrations'"
            ).fetchone()
            row = (
                conn.execute("SELECT COALESCE(MAX(version), 0) FROM schema_migrations").fetchone()
                if has_table
                else None
            )
        except sqlite3.DatabaseError as exc:
            raise StorageError(f"{path} is damaged ({exc})") from None
    version = int(row[0]) if row and row[0] is not None else 0
    if version > len(MIGRATIONS):
        raise SchemaTooNewError(
            f"{path} has schema version {version} but this bot knows only up to "
            f"{len(MIGRATIONS)}: a newer version of the bot wrote it; run that version "
            "(never downgrade the database)"
        )


def _check_header(path: Path) -> None:
    try:
        with path.open("rb") as file:
            header = file.read(HEADER_BYTES)
            size = os.fstat(file.fileno()).st_size
    except OSError as exc:
        raise StorageError(f"{path} cannot be read ({exc.strerror})") from None
    if size == 0:
        return  # an empty file is an empty database to SQLite
    if not header.startswith(SQLITE_MAGIC):
        raise StorageError(f"{path} is not a SQLite database (its first bytes are wrong)")
    if len(header) < HEADER_BYTES:
        raise StorageError(f"{path} is truncated ({size} bytes, not even a whole header)")
    (raw_page_size,) = struct.unpack(">H", header[16:18])
    page_size = 65536 if raw_page_size == 1 else raw_page_size
    if page_size < 512 or page_size & (page_size - 1):
        raise StorageError(f"{path} is damaged (page size {raw_page_size} in its header)")
    (change_counter,) = struct.unpack(">I", header[24:28])
    (page_count,) = struct.unpack(">I", header[28:32])
    (valid_for,) = struct.unpack(">I", header[92:96])
    # The page count in the header is only trusted by SQLite when it was written by the
    # same change as the counter (files of very old writers leave it stale).
    if valid_for == change_counter and page_count and size < page_count * page_size:
        raise StorageError(
            f"{path} is truncated ({size} bytes; its header counts {page_count} pages "
            f"of {page_size} bytes = {page_count * page_size})"
        )
    if size % page_size:
        raise StorageError(
            f"{path} is truncated ({size} bytes, not a whole number of {page_size}-byte pages)"
        )


@contextlib.contextmanager
def _read_only(path: Path) -> Iterator[sqlite3.Connection]:
    """A connection that cannot write: ``immutable=1`` when there is no write-ahead log
    to read (no lock, no -wal or -shm file created), else ``mode=ro``."""
    wal = path.with_name(path.name + "-wal")
    has_wal = wal.exists() and wal.stat().st_size > 0
    mode = "mode=ro" if has_wal else "immutable=1"
    uri = f"{path.resolve().as_uri()}?{mode}"
    try:
        conn = sqlite3.connect(uri, uri=True)
    except sqlite3.Error as exc:
        raise StorageError(f"{path} cannot be opened ({exc})") from None
    try:
        yield conn
    finally:
        conn.close()
