"""The bot's memory indexes Chroma's write log by collection, and Chroma still reads,
replays and purges that log right.

Chroma's two statements on its log are copied in shape from chromadb 1.5.9 (the read
when an index loads, the purge after a write): SQLite must plan both with the index, or
each load scans every community's unsaved writes (storage/chroma_log.py).
"""

from __future__ import annotations

import contextlib
import logging
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from app.wiring import open_memory
from bot.settings import Settings
from chroma_memory.embedding import FastMiniLML6V2, close_chroma_client
from chroma_memory.hosts import LocalMemory
from storage.chroma_log import LOG_INDEX, index_chroma_log

#: How Chroma reads a collection's unsaved writes when it loads the collection's index.
CHROMA_LOG_READ = (
    "SELECT seq_id, id, operation, vector, encoding, metadata FROM embeddings_queue "
    "WHERE topic = ? AND seq_id > ? "
    "AND CAST(strftime('%s', created_at) AS INTEGER) <= (? / 1000000000) ORDER BY seq_id ASC"
)
#: How Chroma drops a collection's saved writes from the log after a write.
CHROMA_LOG_PURGE = "DELETE FROM embeddings_queue WHERE topic = ? AND seq_id < ?"

SUMMARIES = {
    "bread": "Sourdough bread needs a long, cold fermentation for flavour",
    "cycling": "Protected bike lanes make city cycling much safer",
    "tax": "A progressive income tax with fewer loopholes is fairer",
}


@pytest.fixture
def chroma_dir(tmp_path: Path) -> Iterator[Path]:
    path = tmp_path / "data" / "chromadb"
    yield path
    close_chroma_client(path)


def rows(db: Path, statement: str, parameters: tuple[object, ...] = ()) -> list[Any]:
    """`statement`'s rows (committed), on a connection of its own."""
    with contextlib.closing(sqlite3.connect(db)) as conn, conn:
        return conn.execute(statement, parameters).fetchall()


def plan(db: Path, statement: str, parameters: tuple[object, ...]) -> str:
    found = rows(db, f"EXPLAIN QUERY PLAN {statement}", parameters)
    return " | ".join(str(row[-1]) for row in found)


def test_the_bots_memory_indexes_the_log_and_chroma_replays_and_purges_it(
    chroma_dir: Path, embedding_function: FastMiniLML6V2
) -> None:
    values: dict[str, Any] = {
        "SONALITY_DATA_DIR": str(chroma_dir.parent),
        "SONALITY_CHROMA_MAX_OPEN": 1,  # every other store call loads an index again
    }
    settings = Settings(_env_file=None, **values)  # type: ignore[call-arg]
    memory = open_memory(settings)
    assert isinstance(memory, LocalMemory)
    db = chroma_dir / "chroma.sqlite3"
    read = plan(db, CHROMA_LOG_READ, ("topic", 0, 2**62))
    purge = plan(db, CHROMA_LOG_PURGE, ("topic", 0))
    assert f"USING INDEX {LOG_INDEX}" in read, read
    assert f"USING INDEX {LOG_INDEX}" in purge, purge

    stores = {name: memory.store_for(f"test:{name}", embedding_function) for name in SUMMARIES}
    for name, store in stores.items():
        for i in range(3):  # unsaved: Chroma saves an index only every 32 writes
            store.store("m", "r", 0.6, [name], f"{SUMMARIES[name]} ({i})", episode_id=f"{name}-{i}")
    stores["tax"].delete(["tax-0"])  # a forget-me: purges the log and reopens Chroma
    assert memory.reopens() >= 2

    # Each load found its own unsaved writes through the index, no other community's.
    for name, store in stores.items():
        recalled = store.retrieve(SUMMARIES[name], n_results=5, min_relevance=-1.0)
        kept = range(1, 3) if name == "tax" else range(3)
        assert sorted(recalled) == sorted(f"{SUMMARIES[name]} ({i})" for i in kept), name
    logged = [row[0] for row in rows(db, "SELECT id FROM embeddings_queue")]
    deletion = rows(db, "SELECT vector, metadata FROM embeddings_queue WHERE id = 'tax-0'")
    assert deletion == [(None, "{}")]  # the deletion itself: no words, no vector
    # The forget-me saved the tax index and the purge dropped its rows up to that save
    # (the last one, the deletion, stays); the other communities' unsaved rows stay.
    assert sorted(i for i in logged if not i.startswith("tax")) == sorted(
        f"{name}-{i}" for name in ("bread", "cycling") for i in range(3)
    )
    assert [i for i in logged if i.startswith("tax")] == ["tax-0"], logged


def test_indexing_is_idempotent_and_a_file_that_cannot_take_it_only_warns(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    missing = tmp_path / "none"
    assert index_chroma_log(missing) is False  # Chroma has not made its file yet

    made = tmp_path / "made"
    made.mkdir()
    rows(
        made / "chroma.sqlite3",
        "CREATE TABLE embeddings_queue (seq_id INTEGER PRIMARY KEY, topic TEXT)",
    )
    assert index_chroma_log(made) is True
    assert index_chroma_log(made) is True
    indexes = rows(
        made / "chroma.sqlite3",
        "SELECT name FROM sqlite_master WHERE type = 'index' AND tbl_name = 'embeddings_queue'",
    )
    assert indexes == [(LOG_INDEX,)]

    locked = sqlite3.connect(made / "chroma.sqlite3", isolation_level=None)
    locked.execute("BEGIN EXCLUSIVE")  # another program holds the file
    try:
        with caplog.at_level(logging.WARNING, logger="storage.chroma_log"):
            assert index_chroma_log(made, timeout_seconds=0.1) is False
    finally:
        locked.execute("ROLLBACK")
        locked.close()
    assert "database is locked" in caplog.text

    garbage = tmp_path / "garbage"
    garbage.mkdir()
    (garbage / "chroma.sqlite3").write_bytes(b"not a database, " * 512)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="storage.chroma_log"):
        assert index_chroma_log(garbage) is False
    assert "could not index Chroma's write log" in caplog.text
    assert (garbage / "chroma.sqlite3").read_bytes() == b"not a database, " * 512
