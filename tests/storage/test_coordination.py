"""The locks several processes share one PostgreSQL database by (`storage.coordination`).

Two `Database` objects are two sessions to PostgreSQL, exactly as two processes are;
closing one is what the server sees of a process killed with -9 (its connections end).
"""

from __future__ import annotations

import asyncio
from datetime import timedelta

from sonality.store import InteractionRecord, Speaker, utcnow
from storage import Database
from tests.pg import PostgresServer


async def test_a_job_run_belongs_to_one_process_until_it_ends(
    postgres_server: PostgresServer,
) -> None:
    url = postgres_server.new_database()
    first, second = await Database.open_url(url), await Database.open_url(url)
    try:
        async with first.job_run("nightly") as mine:
            assert mine
            async with second.job_run("nightly") as theirs:
                assert not theirs
            async with second.job_run("housekeeping") as other_job:
                assert other_job  # each job has its own lock
        async with second.job_run("nightly") as theirs:
            assert theirs  # released when the run ended
    finally:
        await first.close()
        await second.close()


async def test_a_lease_is_shared_within_a_process_and_dies_with_it(
    postgres_server: PostgresServer,
) -> None:
    url = postgres_server.new_database()
    first, second = await Database.open_url(url), await Database.open_url(url)
    try:
        mine = first.community("slack:T1").learning_lease()
        again = first.community("slack:T1").learning_lease()
        theirs = second.community("slack:T1").learning_lease()
        assert mine is not None and again is not None and theirs is not None
        assert await mine.acquire()
        assert await again.acquire()  # the same process: counted, not refused
        assert not await theirs.acquire()
        await mine.release()
        assert not await theirs.acquire()  # still held by the second holder
        await again.release()
        assert await theirs.acquire()
        await second.close()  # the holder dies: the server frees the lock
        # ... once its backend has ended, a moment after the client hung up.
        for _ in range(100):
            if await mine.acquire():
                break
            await asyncio.sleep(0.05)
        else:
            raise AssertionError("the lock outlived its session")
    finally:
        await first.close()
        await second.close()


async def test_communities_waiting_to_learn_lists_only_old_pending_rows(
    postgres_server: PostgresServer,
) -> None:
    async with await Database.open_url(postgres_server.new_database()) as db:
        now = utcnow()
        speaker = Speaker(id="U1", name="Ann")
        old = InteractionRecord(
            id="old", speaker=speaker, message="m", reply="r", created_at=now - timedelta(minutes=1)
        )
        await db.community("slack:OLD").record_interaction(old)
        new = InteractionRecord(id="new", speaker=speaker, message="m", reply="r", created_at=now)
        await db.community("slack:NEW").record_interaction(new)
        assert await db.communities_waiting_to_learn(now - timedelta(seconds=5)) == ["slack:OLD"]


async def test_a_lost_lock_connection_gives_up_its_locks_and_is_opened_again(
    postgres_server: PostgresServer,
) -> None:
    url = postgres_server.new_database()
    first, second = await Database.open_url(url), await Database.open_url(url)
    try:
        mine = first.community("slack:T1").learning_lease()
        theirs = second.community("slack:T1").learning_lease()
        assert mine is not None and theirs is not None
        assert await mine.acquire()
        # The server ends the session that holds the lock (a restart, a failover, an
        # administrator): the lock goes with it.
        database = url.rsplit("/", 1)[1]
        postgres_server.admin(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            f"WHERE datname = '{database}' AND query LIKE '%pg_try_advisory_lock%'"
        )
        for _ in range(100):
            if await theirs.acquire():
                break
            await asyncio.sleep(0.05)
        else:
            raise AssertionError("the lock outlived its session")
        assert not await mine.acquire()  # a new connection, asking like anyone else
        await theirs.release()
        assert await mine.acquire()
    finally:
        await first.close()
        await second.close()


async def test_a_community_being_learned_is_not_listed_as_waiting(
    postgres_server: PostgresServer,
) -> None:
    """The orphan sweep must not load an agent, in every process, whose learner is alive."""
    url = postgres_server.new_database()
    first, second = await Database.open_url(url), await Database.open_url(url)
    try:
        now = utcnow()
        speaker = Speaker(id="U1", name="Ann")
        for community_id in ("slack:BUSY", "slack:IDLE"):
            await first.community(community_id).record_interaction(
                InteractionRecord(id="old", speaker=speaker, message="m", reply="r", created_at=now)
            )
        lease = first.community("slack:BUSY").learning_lease()
        assert lease is not None and await lease.acquire()
        later = now + timedelta(minutes=1)
        assert await second.communities_waiting_to_learn(later) == ["slack:IDLE"]
        await lease.release()
        assert await second.communities_waiting_to_learn(later) == ["slack:BUSY", "slack:IDLE"]
    finally:
        await first.close()
        await second.close()
