"""Erasing a community the bot was removed from: every row, through the audited gate."""

from __future__ import annotations

from datetime import timedelta

import pytest

from sonality.llm import Usage
from sonality.store import AuditEvent, UsageRecord
from storage import Database

from .conftest import Backend, at, commit_of, record

GONE = "slack:T0GONE"
STAYS = "slack:T0STAYS"
MARK = "zebra-quartz-7741"  # a unique word only the erased community used


async def fill(db: Database, community_id: str, word: str) -> None:
    store = db.community(community_id)
    await store.commit(commit_of(0))
    await store.record_interaction(record("i1", message=f"I say {word}"))
    await store.commit(
        commit_of(
            1,
            interaction_id="i1",
            events=[AuditEvent(kind="ess", interaction=1, payload={"summary": word})],
            usage=[UsageRecord(purpose="ess", model="m", usage=Usage(input_tokens=7))],
        )
    )
    await db.touch_community(community_id, name=f"team {word}", at=at(1))
    await db.append_exchange(community_id, "u1", f"I say {word}", "ok", at(1))
    await db.record_feedback(community_id, "1700000000.000100", "u1", True, at(1))
    team = community_id.partition(":")[2]
    key = {"enterprise_id": None, "team_id": team, "user_id": "U1"}
    await db.save_installation(key, {"bot_token": f"xoxb-{word}"})


def counts(backend: Backend, community_id: str) -> dict[str, int]:
    """Rows per table that mention the community, read beside the bot's connection."""
    if backend.postgres:
        listed = backend.sql(
            "SELECT table_name, column_name FROM information_schema.columns "
            "WHERE table_schema = current_schema()"
        )
    else:
        listed = [
            (table, column[1])
            for (table,) in backend.sql("SELECT name FROM sqlite_master WHERE type='table'")
            for column in backend.sql(f'PRAGMA table_info("{table}")')
        ]
    out = {}
    for table in sorted({str(t) for t, _ in listed}):
        cols = {str(c) for t, c in listed if t == table}
        col = "id" if table == "communities" else "community_id"
        if col in cols and table != "community_erasures":
            [(n,)] = backend.sql(
                f'SELECT COUNT(*) FROM "{table}" WHERE "{col}" = ?', (community_id,)
            )
            out[table] = int(str(n))
    return out


async def test_erasure_deletes_every_row_and_token_and_nothing_else(backend: Backend) -> None:
    db = await backend.open()
    try:
        await fill(db, GONE, MARK)
        await fill(db, STAYS, "other-words")
        before_other = counts(backend, STAYS)
        assert counts(backend, GONE)["personality_versions"] == 2

        removal = await db.mark_removed(GONE, at(0), timedelta(days=30))
        assert removal.delete_at == at(0) + timedelta(days=30)
        # A second event (tokens_revoked after app_uninstalled) keeps the first deadline.
        again = await db.mark_removed(GONE, at(60), timedelta(days=30))
        assert again.delete_at == removal.delete_at
        assert await db.due_erasures(at(0) + timedelta(days=29)) == []
        assert await db.due_erasures(at(0) + timedelta(days=30)) == [GONE]

        deleted = await db.erase_community(GONE, at(0) + timedelta(days=30))
        assert deleted >= 8
        assert not any(counts(backend, GONE).values()), counts(backend, GONE)
        assert counts(backend, STAYS) == before_other
        assert await db.find_installation(None, "T0GONE") is None
        assert await db.find_installation(None, "T0STAYS") is not None
        assert await db.removals() == []
        [(started, finished, rows)] = await db.erasures(GONE)
        assert finished == started and rows == deleted
        if not backend.postgres:
            # Checked while the bot runs: neither free pages nor the WAL keep the text
            # (secure_delete: a promise about the SQLite file's bytes only).
            data = b"".join(p.read_bytes() for p in backend.path.parent.iterdir())
            assert MARK.encode() not in data
            assert b"other-words" in data
    finally:
        await db.close()


async def test_versions_stay_append_only_outside_an_erasure(db: Database, backend: Backend) -> None:
    await fill(db, GONE, MARK)
    await db.erase_community(STAYS, at(0))  # a finished erasure of another community
    with pytest.raises(backend.integrity_error, match="append-only"):
        backend.run("DELETE FROM personality_versions WHERE community_id = ?", (GONE,))
    # Not even after this community's own erasure finished: the gate closed with it.
    await db.erase_community(GONE, at(1))
    await fill(db, GONE, MARK)
    with pytest.raises(backend.integrity_error, match="append-only"):
        backend.run("DELETE FROM personality_versions WHERE community_id = ?", (GONE,))


async def test_return_before_the_deadline_keeps_everything(db: Database, backend: Backend) -> None:
    await fill(db, GONE, MARK)
    before = counts(backend, GONE)
    await db.mark_removed(GONE, at(0), timedelta(days=30))
    assert await db.mark_returned(GONE, at(0) + timedelta(days=29)) == "kept"
    assert await db.due_erasures(at(0) + timedelta(days=365)) == []
    assert counts(backend, GONE) == before
    assert await db.mark_returned(GONE, at(0)) == "not-removed"


async def test_return_after_the_deadline_erases_first(db: Database, backend: Backend) -> None:
    await fill(db, GONE, MARK)
    await db.mark_removed(GONE, at(0), timedelta(days=30))
    # Housekeeping has not run yet: coming back late still means starting from the seed.
    assert await db.mark_returned(GONE, at(0) + timedelta(days=31)) == "erased"
    assert not any(counts(backend, GONE).values())
    assert await db.removals() == []
