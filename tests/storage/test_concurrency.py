"""Concurrent use of one Database from many tasks."""

from __future__ import annotations

import asyncio
import contextlib

from sonality.store import AuditEvent
from storage import Database, VersionConflictError

from .conftest import commit_of, record


async def _run_community(db: Database, cid: str, n: int) -> None:
    store = db.community(cid)
    await store.commit(commit_of(0, cause="seed"))
    for v in range(1, n + 1):
        await store.record_interaction(record(f"{cid}-{v}", f"msg {v}"))
        await asyncio.sleep(0)
        await store.commit(commit_of(v, interaction_id=f"{cid}-{v}"))


async def test_two_communities_commit_concurrently(db: Database) -> None:
    await asyncio.gather(_run_community(db, "discord:1", 15), _run_community(db, "slack:T1", 15))
    for cid in ("discord:1", "slack:T1"):
        store = db.community(cid)
        assert await store.latest_version() == 15
        assert [v.version for v in await store.versions(limit=100)] == list(range(15, -1, -1))
        assert await store.pending_interactions() == []
        assert (await db.usage_totals(cid)).calls == 15


async def test_racing_commits_of_one_version_exactly_one_wins(db: Database) -> None:
    store = db.community("discord:1")
    await store.commit(commit_of(0))
    results = await asyncio.gather(
        *(store.commit(commit_of(1)) for _ in range(5)), return_exceptions=True
    )
    assert results.count(None) == 1
    assert all(isinstance(r, VersionConflictError) for r in results if r is not None)
    assert await store.latest_version() == 1


async def test_reads_never_see_a_half_written_commit(db: Database) -> None:
    store = db.community("discord:1")
    await store.commit(commit_of(0))
    seen: list[tuple[int, int, int]] = []
    writing = True

    async def reader() -> None:
        # Until the writer is done (and at least 30 times): on PostgreSQL reads do not
        # queue behind writes, so a fixed count could all land before the first commit.
        while writing or len(seen) < 30:
            # One statement: one consistent view of the version, the outbox and its acks.
            row = await db._fetchone(
                "SELECT (SELECT MAX(version) FROM personality_versions), "
                "(SELECT COUNT(*) FROM interactions WHERE status = 'pending'), "
                "(SELECT COUNT(*) FROM interactions)"
            )
            assert row is not None
            seen.append(row)
            await asyncio.sleep(0)

    async def writer() -> None:
        nonlocal writing
        for v in range(1, 11):
            await store.record_interaction(record(f"i{v}"))
            await store.commit(commit_of(v, interaction_id=f"i{v}"))
        writing = False

    await asyncio.gather(reader(), writer())
    assert all(pending in (0, 1) for _, pending, _ in seen)
    # Every recorded interaction is either still pending or has its version: a commit
    # seen with its version but not its ack (or the reverse) would break this.
    assert all(latest + pending == recorded for latest, pending, recorded in seen)
    assert len({latest for latest, _, _ in seen}) > 1  # the reads did overlap the writes


async def test_cancelled_commits_are_all_or_nothing(db: Database) -> None:
    """Cancel commits at many different points: each is applied fully or not at all.

    A commit is one call into the SQLite thread that runs the whole transaction
    (storage.base), so there is no point between two of its statements to cancel at:
    cancelled before that call is queued it writes nothing, after it the transaction
    still runs to its end and only the result is dropped. Both cases are reached.
    """
    store = db.community("discord:1")
    await store.commit(commit_of(0))
    outcomes: list[bool] = []
    for steps in range(8):
        latest = await store.latest_version()
        assert latest is not None
        interaction = f"i{latest + 1}-{steps}"
        await store.record_interaction(record(interaction))
        events = [AuditEvent(kind="ess", interaction=n) for n in range(3)]
        task = asyncio.create_task(
            store.commit(commit_of(latest + 1, interaction_id=interaction, events=events))
        )
        # Cancel after `steps` turns of the event loop: at 0 the commit has not started,
        # at 1 it has just handed its transaction to the SQLite thread, later it may be done.
        for _ in range(steps):
            await asyncio.sleep(0)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        applied = await store.latest_version() == latest + 1
        pending = [r.id for r in await store.pending_interactions()]
        version_events = [
            e for e in await store.audit_events(limit=1000) if e.version == latest + 1
        ]
        assert (interaction not in pending) == applied
        assert len(version_events) == (3 if applied else 0)
        outcomes.append(applied)
        if not applied:
            await store.commit(commit_of(latest + 1, interaction_id=interaction))
    assert set(outcomes) == {True, False}, outcomes
