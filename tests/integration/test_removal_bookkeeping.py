"""`bot.community_removal.CommunityRemovals` on a real database: erasure at once with 0 days, a
failed memory delete retried, and the silence surviving a restart."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

from bot.community_removal import CommunityRemovals
from bot.messages import Community
from bot.registry import CommunityRegistry
from sonality.agent import SonalityAgent
from storage import Database

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
GONE = "discord:42"


async def no_agents(community: Community) -> SonalityAgent:
    raise AssertionError(f"no agent should be loaded for {community.id}")


async def test_zero_days_erases_at_once_and_a_failed_memory_delete_is_retried(
    tmp_path: Path,
) -> None:
    db = await Database.open(tmp_path / "bot.sqlite3")
    try:
        await db.touch_community(GONE, "Guild", at=T0)
        forgotten: list[str] = []

        async def forget(community_id: str) -> None:
            forgotten.append(community_id)
            if len(forgotten) == 1:
                raise RuntimeError("chroma is down")

        removals = CommunityRemovals(
            db,
            CommunityRegistry(no_agents, 60),
            keep_days=0,
            forget_memory=forget,
            clock=lambda: T0,
        )
        await removals.removed(GONE, "kicked")
        assert removals.is_removed(GONE)
        # The memories could not be deleted: the rows (and the due removal) stay.
        assert await db.community_info(GONE) is not None
        assert await db.due_erasures(T0) == [GONE]

        assert await removals.erase_due(T0 + timedelta(hours=1)) == [GONE]
        assert forgotten == [GONE, GONE]
        assert await db.community_info(GONE) is None
        assert await db.removals() == []
    finally:
        await db.close()


async def test_the_silence_survives_a_restart(tmp_path: Path) -> None:
    path = tmp_path / "bot.sqlite3"
    db = await Database.open(path)
    try:
        first = CommunityRemovals(db, CommunityRegistry(no_agents, 60), 30, clock=lambda: T0)
        await first.removed(GONE, "kicked")
    finally:
        await db.close()
    db = await Database.open(path)
    try:
        later = CommunityRemovals(db, CommunityRegistry(no_agents, 60), 30, clock=lambda: T0)
        assert not later.is_removed(GONE)
        await later.load()
        assert later.is_removed(GONE)
        assert await later.added_back(GONE, T0 + timedelta(days=1)) == "kept"
        assert not later.is_removed(GONE)
        assert await db.removals() == []
    finally:
        await db.close()
