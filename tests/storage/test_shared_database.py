"""Two `Database` objects on one database, as two bot processes would share it.

On SQLite they are two connections to one file (SQLite's file lock orders them); on
PostgreSQL two connection pools whose transactions really run at the same time, so
these are where SERIALIZABLE and re-running a conflicting write are put to work.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator

import pytest

from sonality.llm import Usage
from sonality.store import UsageRecord
from storage import Database, VersionConflictError
from storage.base import Conn, execute, fetchone

from .conftest import T0, Backend, at, commit_of, record

CID = "slack:T1"


@pytest.fixture
async def two(backend: Backend) -> AsyncIterator[tuple[Database, Database]]:
    first = await backend.open()
    second = await backend.open()
    try:
        yield first, second
    finally:
        await first.close()
        await second.close()


async def test_an_event_is_seen_once_across_both(two: tuple[Database, Database]) -> None:
    ids = [f"Ev{n}" for n in range(25)]
    attempts = [db.mark_event_seen("slack", e, T0, 300) for e in ids for db in two for _ in "ab"]
    results = await asyncio.gather(*attempts)
    assert results.count(True) == len(ids)
    firsts = {ids[i // 4] for i, seen in enumerate(results) if seen}
    assert firsts == set(ids)


async def test_racing_commits_across_both_leave_one_gap_free_history(
    two: tuple[Database, Database],
) -> None:
    stores = [db.community(CID) for db in two]
    await stores[0].commit(commit_of(0))
    for version in range(1, 6):
        results = await asyncio.gather(
            *(store.commit(commit_of(version)) for store in stores for _ in range(3)),
            return_exceptions=True,
        )
        assert results.count(None) == 1, results
        assert all(isinstance(r, VersionConflictError) for r in results if r is not None)
    history = await stores[1].versions(limit=100)
    assert [v.version for v in history] == [5, 4, 3, 2, 1, 0]


async def test_usage_counted_from_both_at_once_adds_up(two: tuple[Database, Database]) -> None:
    def used(n: int) -> UsageRecord:
        return UsageRecord(
            purpose="reply", model="m", usage=Usage(input_tokens=n), created_at=at(n % 60)
        )

    await asyncio.gather(
        *(db.community(CID).record_usage([used(n)]) for n in range(1, 21) for db in two)
    )
    totals = await two[0].usage_totals(CID)
    assert totals.calls == 40
    assert totals.usage.input_tokens == 2 * sum(range(1, 21))


async def test_an_interaction_recorded_by_both_is_queued_once(
    two: tuple[Database, Database],
) -> None:
    rec = record("i1")
    await asyncio.gather(*(db.community(CID).record_interaction(rec) for db in two for _ in "ab"))
    assert [r.id for r in await two[1].community(CID).pending_interactions()] == ["i1"]
    assert (await two[0].usage_totals(CID)).calls == 1  # the reply's usage counted once
    when = await two[0].community_info(CID)
    assert when is not None and when.last_activity_at == T0


async def test_postgres_writes_of_one_scope_take_turns_other_scopes_do_not_wait(
    two: tuple[Database, Database], backend: Backend
) -> None:
    if not backend.postgres:
        pytest.skip("write scopes are PostgreSQL's (SQLite has one writer for the file)")
    first, second = two
    started, release = threading.Event(), threading.Event()

    def held(conn: Conn) -> str:
        started.set()
        release.wait(30)
        return str(fetchone(conn, "SELECT current_setting('transaction_isolation')"))

    holder = asyncio.create_task(first._run_write(held, scope="slack:T1"))
    assert await asyncio.to_thread(started.wait, 30)
    # Another community writes while slack:T1's write is open...
    await second._run_write(lambda c: execute(c, "SELECT 1"), scope="slack:T2")
    # ...a second write of slack:T1, from the other "process", waits for it.
    waiting = asyncio.create_task(
        second._run_write(lambda c: execute(c, "SELECT 1"), scope="slack:T1")
    )
    await asyncio.sleep(0.3)
    assert not waiting.done()
    release.set()
    assert await holder == "('read committed',)"
    await waiting


async def test_postgres_reads_are_one_read_only_snapshot(db: Database, backend: Backend) -> None:
    if not backend.postgres:
        pytest.skip("transaction isolation levels are PostgreSQL's")
    query = (
        "SELECT current_setting('transaction_isolation'), current_setting('transaction_read_only')"
    )
    for _ in range(2):  # pooled connections are reused: each operation sets its own mode
        assert await db._run_write(lambda c: fetchone(c, query)) == ("read committed", "off")
        assert await db._run_read(lambda c: fetchone(c, query)) == ("repeatable read", "on")


async def test_postgres_connections_cut_by_the_server_are_replaced(
    db: Database, backend: Backend
) -> None:
    if not backend.postgres:
        pytest.skip("a connection pool is PostgreSQL's")
    await asyncio.gather(*(db.touch_community(f"c:{n}", at=T0) for n in range(8)))
    # What a server restart or failover does to every open connection.
    backend.run(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
        "WHERE datname = current_database() AND pid <> pg_backend_pid()"
    )
    await db.touch_community("c:after", at=T0)
    assert "c:after" in await db.community_ids()


async def test_after_a_restart_a_full_pool_of_dead_connections_costs_one_check(
    db: Database, backend: Backend
) -> None:
    """Every pooled connection dead at once, as after a server restart: the next
    operation gets a working connection on the first try after one dead one. The
    pool's own check tried the dead ones one at a time with a pause of 1, 2, 4, 8,
    16 s between tries, so with 8 of them the operation ran into its 30 s timeout
    and failed."""
    if not backend.postgres:
        pytest.skip("a connection pool is PostgreSQL's")
    # Eight reads, each holding its connection until all eight hold one: the pool grows
    # to its 8.
    together = threading.Barrier(8)
    await asyncio.gather(*(db._run_read(lambda c: together.wait(30)) for _ in range(8)))
    pool = db._engine.pool  # type: ignore[attr-defined]
    assert pool.get_stats()["pool_size"] == 8
    backend.run(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
        "WHERE datname = current_database() AND pid <> pg_backend_pid()"
    )
    await db.touch_community("c:after", at=T0)
    assert "c:after" in await db.community_ids()
    # The first dead connection was returned as bad, and made the pool test the idle
    # ones at once: the other 7 were found there, not one borrow at a time.
    stats = pool.get_stats()
    assert (stats["returns_bad"], stats["connections_lost"]) == (1, 7)
