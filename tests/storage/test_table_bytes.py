"""`storage.maintenance.table_bytes`: what the disk-use benchmark (figure 6) reports per
table, read through SQLite's `dbstat` after the WAL is checkpointed."""

from __future__ import annotations

from pathlib import Path

from sonality.state import SpongeState
from sonality.store import StateCommit
from storage import Database
from storage.maintenance import table_bytes


async def test_each_table_is_counted_with_its_indexes_and_grows_with_its_rows(
    tmp_path: Path,
) -> None:
    path = tmp_path / "sonality.sqlite3"
    db = await Database.open(path)
    try:
        store = db.community("test:c1")
        await store.commit(StateCommit(state=SpongeState(), cause="seed", change="seed"))
        before = table_bytes(path)
        for n in range(1, 200):
            state = SpongeState(version=n, snapshot=f"narrative {n} " * 40)
            await store.commit(StateCommit(state=state, cause="reflection", change=f"v{n}"))
        after = table_bytes(path)
    finally:
        await db.close()
    assert after["personality_versions"] > before["personality_versions"] + 100_000
    assert all(not name.startswith("sqlite_autoindex") for name in after)  # owned by tables
    # Every page of the file belongs to some table (the WAL was checkpointed into it).
    assert sum(after.values()) <= path.stat().st_size
    assert sum(after.values()) > 0.9 * path.stat().st_size
