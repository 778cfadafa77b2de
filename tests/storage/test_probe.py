"""`storage.probe`: the start-up look at SQLite files finds what is wrong and writes nothing."""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

import pytest

from storage import Database, SchemaTooNewError, StorageError
from storage.migrations import MIGRATIONS
from storage.probe import probe_database, probe_sqlite_file


async def real_database(path: Path) -> None:
    db = await Database.open(path)
    try:
        await db.touch_community("c1", name="one")
    finally:
        await db.close()


def cut(path: Path, keep: int) -> bytes:
    """Keep the first `keep` bytes of `path` (negative: drop that many at the end)."""
    whole = path.read_bytes()
    kept = whole[:keep]
    path.write_bytes(kept)
    return kept


def listing(directory: Path) -> dict[str, tuple[bytes, int]]:
    return {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in directory.iterdir()}


async def test_a_healthy_database_passes_and_nothing_is_created(tmp_path: Path) -> None:
    database = tmp_path / "sonality.sqlite3"
    await real_database(database)
    before = listing(tmp_path)
    probe_database(database)
    assert listing(tmp_path) == before  # no -wal, no -shm, same bytes and mtime


async def test_a_database_with_a_live_write_ahead_log_passes(tmp_path: Path) -> None:
    """A bot killed mid-run leaves committed pages in the -wal; they are read, not lost."""
    database = tmp_path / "sonality.sqlite3"
    await real_database(database)
    writer = sqlite3.connect(database)
    writer.execute("PRAGMA journal_mode=WAL")
    writer.execute("PRAGMA wal_autocheckpoint=0")
    with writer:
        writer.execute(
            "INSERT INTO schema_migrations (version, applied_at) VALUES (?, ?)",
            (len(MIGRATIONS) + 50, "2030-01-01T00:00:00+00:00"),
        )
    wal = tmp_path / "sonality.sqlite3-wal"
    assert wal.stat().st_size > 0
    try:
        with pytest.raises(SchemaTooNewError, match=f"schema version {len(MIGRATIONS) + 50}"):
            probe_database(database)  # the version row lives only in the -wal
    finally:
        writer.close()


async def test_a_truncated_copy_is_named_with_its_sizes(tmp_path: Path) -> None:
    database = tmp_path / "sonality.sqlite3"
    await real_database(database)
    kept = cut(database, os.stat(database).st_size // 2)
    with pytest.raises(StorageError, match=r"is truncated \(\d+ bytes; its header counts"):
        probe_database(database)
    assert listing(tmp_path)[database.name][0] == kept


async def test_a_copy_cut_mid_page_is_truncated(tmp_path: Path) -> None:
    database = tmp_path / "sonality.sqlite3"
    await real_database(database)
    cut(database, -100)
    with pytest.raises(StorageError, match="truncated"):
        probe_database(database)


@pytest.mark.parametrize(
    "content",
    [os.urandom(8192), b"SQLite format 3\x00" + b"\x00" * 10, b"PK\x03\x04 a zip file"],
    ids=["random", "header cut short", "another format"],
)
def test_foreign_or_cut_bytes_are_refused(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "chroma.sqlite3"
    path.write_bytes(content)
    with pytest.raises(StorageError, match=r"not a SQLite database|truncated"):
        probe_sqlite_file(path)
    assert path.read_bytes() == content


def test_an_empty_file_is_an_empty_database(tmp_path: Path) -> None:
    path = tmp_path / "sonality.sqlite3"
    path.touch()
    probe_database(path)
    assert path.read_bytes() == b""
