"""Every storage operation is ONE call into the engine's thread, on both engines.

Why it matters: each call waits for the event loop to resume the awaiting coroutine, so
under load a transaction made of many calls holds up every other DB operation for many
loop iterations. These tests count the calls (on SQLite by wrapping the connection's
`_execute`, the one entry point every aiosqlite call goes through; on PostgreSQL the
engine's one hand-over to its threads) and check that many communities writing at once
on a busy event loop still leave consistent data.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from sonality.llm import Usage
from sonality.store import AuditEvent, UsageRecord
from storage import Database, StorageError, VersionConflictError
from storage.base import Conn, PostgresEngine

from .conftest import Backend, at, commit_of, episode, record


class RoundTrips:
    """Counts calls into the worker thread(s) of one database."""

    def __init__(self, db: Database, monkeypatch: pytest.MonkeyPatch) -> None:
        self.count = 0
        target: Any = db._engine if isinstance(db._engine, PostgresEngine) else db._conn
        name = "_in_thread" if isinstance(db._engine, PostgresEngine) else "_execute"
        original = getattr(target, name)

        async def counting(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
            self.count += 1
            return await original(fn, *args, **kwargs)

        monkeypatch.setattr(target, name, counting)

    async def of(self, operation: Awaitable[Any]) -> int:
        """Await `operation`; returns how many worker calls it made."""
        before = self.count
        await operation
        return self.count - before


@pytest.fixture
def trips(db: Database, monkeypatch: pytest.MonkeyPatch) -> RoundTrips:
    return RoundTrips(db, monkeypatch)


def rich_commit(version: int, interaction_id: str | None, tag: str = "") -> Any:
    """A commit with several audit events, usage records and episodes."""
    commit = commit_of(
        version,
        interaction_id=interaction_id,
        events=[AuditEvent(kind="ess", interaction=n, payload={"n": n}) for n in range(3)],
        usage=[
            UsageRecord(purpose=p, model="m", usage=Usage(input_tokens=3, output_tokens=1))
            for p in ("ess", "opinion", "reflection")
        ],
    )
    commit.episodes.extend(episode(f"{tag}e{version}-{n}") for n in range(3))
    return commit


async def test_recording_an_interaction_is_a_few_statements(
    db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The write a reply waits for before it is sent; on PostgreSQL every statement is
    a network round trip: the community's activity time (created if missing), the row
    and the reply's tokens, behind the write-scope lock there."""
    store = db.community("discord:new")
    statements: list[str] = []
    original = Conn.cursor

    def counting(self: Conn, sql: str, params: Any = ()) -> Any:
        statements.append(sql)
        return original(self, sql, params)

    monkeypatch.setattr(Conn, "cursor", counting)
    await store.record_interaction(record("i1", minutes=1))
    assert len(statements) == (4 if db.dialect.postgres else 3), statements
    monkeypatch.undo()
    info = await db.community_info("discord:new")
    assert info is not None and (info.platform, info.last_activity_at) == ("discord", at(1))
    await store.record_interaction(record("i0", minutes=0))  # older: the time stays
    info = await db.community_info("discord:new")
    assert info is not None and info.last_activity_at == at(1)


async def test_main_operations_take_exactly_one_round_trip(db: Database, trips: RoundTrips) -> None:
    store = db.community("discord:1")
    assert await trips.of(store.commit(rich_commit(0, None))) == 1

    assert await trips.of(store.record_interaction(record("i1"))) == 1
    assert await trips.of(store.record_interaction(record("i1"))) == 1  # idempotent repeat
    assert await trips.of(store.pending_interactions()) == 1
    assert await trips.of(store.commit(rich_commit(1, "i1"))) == 1

    assert await trips.of(db.append_exchange("discord:1", "u1", "hello", "hi!", at(1))) == 1
    assert await trips.of(db.recent_turns("discord:1", "u1", 10, 1000)) == 1

    # ...and each of them did its whole job in that one call.
    assert await store.latest_version() == 1
    assert await store.pending_interactions() == []
    assert len(await store.audit_events(limit=100)) == 6
    assert (await db.usage_totals("discord:1")).calls == 1 + 6  # the reply + 2x3 records
    assert len(await store.pending_episodes()) == 6
    assert await db.recent_turns("discord:1", "u1", 10, 1000) == [
        ("user", "hello"),
        ("assistant", "hi!"),
    ]


async def test_every_other_operation_takes_one_round_trip(db: Database, trips: RoundTrips) -> None:
    store = db.community("discord:1")
    await store.commit(rich_commit(0, None))
    await store.record_interaction(record("i1"))
    operations: dict[str, Callable[[], Awaitable[Any]]] = {
        "latest_state": store.latest_state,
        "state_at": lambda: store.state_at(0),
        "latest_version": store.latest_version,
        "versions": store.versions,
        "pending_episodes": store.pending_episodes,
        "mark_episodes_written": lambda: store.mark_episodes_written(["e0-0", "e0-1", "e0-2"]),
        "pending_count": store.pending_count,
        "mark_interaction_failed": lambda: store.mark_interaction_failed("i1", "boom"),
        "audit_events": store.audit_events,
        "touch_community": lambda: db.touch_community("discord:1", "Guild", at(2)),
        "communities_needing_nightly": lambda: db.communities_needing_nightly(),
        "mark_reflected": lambda: db.mark_reflected("discord:1", at(3)),
        "community_ids": db.community_ids,
        "community_info": lambda: db.community_info("discord:1"),
        "usage_totals": lambda: db.usage_totals("discord:1"),
        "record_moderator_action": lambda: db.record_moderator_action(
            "discord:1", actor_id="a", actor_name="A", action="rollback", allowed=True
        ),
        "moderator_actions": lambda: db.moderator_actions("discord:1"),
        "prune_turns": lambda: db.prune_turns(at(100)),
        "mark_event_seen": lambda: db.mark_event_seen("slack", "Ev1", at(0), 60),
        "save_installation": lambda: db.save_installation({"team_id": "T1"}, {"x": 1}),
        "find_installation": lambda: db.find_installation(None, "T1"),
        "delete_installation": lambda: db.delete_installation(None, "T1"),
        "issue_oauth_state": lambda: db.issue_oauth_state("s", at(10)),
        "consume_oauth_state": lambda: db.consume_oauth_state("s", at(0)),
    }
    counts = {name: await trips.of(op()) for name, op in operations.items()}
    assert counts == dict.fromkeys(operations, 1)
    assert await store.pending_episodes() == []


async def test_a_refused_commit_is_one_round_trip_and_writes_nothing(
    db: Database, trips: RoundTrips
) -> None:
    store = db.community("discord:1")
    await store.commit(commit_of(0))
    await store.record_interaction(record("i1"))
    before = trips.count
    with pytest.raises(VersionConflictError):
        await store.commit(rich_commit(5, "i1"))
    assert trips.count - before == 1
    assert await store.latest_version() == 0
    assert [r.id for r in await store.pending_interactions()] == ["i1"]
    assert await store.pending_episodes() == []
    assert await store.audit_events() == []


async def test_a_commit_cancelled_after_it_was_queued_is_applied_in_full(db: Database) -> None:
    store = db.community("discord:1")
    await store.commit(commit_of(0))
    await store.record_interaction(record("i1"))
    task = asyncio.create_task(store.commit(rich_commit(1, "i1")))
    await asyncio.sleep(0)  # the task runs up to awaiting the worker: the call is queued
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert await store.latest_version() == 1
    assert await store.pending_interactions() == []
    assert len(await store.audit_events()) == 3
    assert len(await store.pending_episodes()) == 3


async def test_a_commit_cancelled_before_it_was_queued_writes_nothing(db: Database) -> None:
    store = db.community("discord:1")
    await store.commit(commit_of(0))
    task = asyncio.create_task(store.commit(rich_commit(1, None)))
    task.cancel()  # before the task ever ran
    with pytest.raises(asyncio.CancelledError):
        await task
    assert await store.latest_version() == 0
    assert await store.pending_episodes() == []


async def test_close_lets_queued_operations_finish_and_refuses_new_ones(
    backend: Backend,
) -> None:
    db = await backend.open()
    store = db.community("discord:1")
    writes = [asyncio.create_task(store.record_interaction(record(f"i{n}"))) for n in range(5)]
    await asyncio.sleep(0)  # all five are queued in the worker
    await asyncio.gather(db.close(), db.close())
    await asyncio.gather(*writes)
    with pytest.raises(StorageError):
        await store.pending_count()
    db = await backend.open()
    try:
        assert await db.community("discord:1").pending_count() == 5
    finally:
        await db.close()


COMMUNITIES = 100
PER_COMMUNITY = 5


async def test_many_communities_on_a_busy_event_loop_stay_consistent(
    db: Database, trips: RoundTrips
) -> None:
    """100 communities x 5 racing commits while a CPU hog keeps the event loop busy.

    Within a community the 5 workers race for the next version (losers retry on
    VersionConflictError), so every commit must be atomic for the versions to end up
    contiguous with each interaction acknowledged exactly once.
    """
    stop = asyncio.Event()
    operations = 0  # storage calls this test makes; each must be one round trip
    written_ids: dict[str, set[str]] = {f"discord:{c}": set() for c in range(COMMUNITIES)}

    async def hog() -> None:
        """Small pieces of sync work, yielding to the loop after each piece.

        It pauses 1 ms after every 10 pieces. Without any pause the loop never idles,
        and the aiosqlite worker thread is starved of the GIL (the loop releases and
        retakes it on every iteration, faster than the waiting thread wakes up), so
        this test would take minutes; that is a property of threads under CPython,
        not of this storage code.
        """
        while not stop.is_set():
            for _ in range(10):
                sum(i * i for i in range(300))
                await asyncio.sleep(0)
            await asyncio.sleep(0.001)

    async def worker(cid: str, n: int) -> None:
        nonlocal operations
        store = db.community(cid)
        interaction = f"{cid}-i{n}"
        await store.record_interaction(record(interaction, f"msg {n}"))
        operations += 1
        while True:
            latest = await store.latest_version()
            operations += 2  # this read and the commit below
            try:
                await store.commit(
                    rich_commit(0 if latest is None else latest + 1, interaction, cid)
                )
            except VersionConflictError:
                await asyncio.sleep(0)
                continue
            break
        written = [e.id for e in await store.pending_episodes()]
        await store.mark_episodes_written(written)
        written_ids[cid].update(written)
        operations += 2

    hogs = [asyncio.create_task(hog()) for _ in range(3)]
    try:
        await asyncio.gather(
            *(worker(f"discord:{c}", n) for c in range(COMMUNITIES) for n in range(PER_COMMUNITY))
        )
    finally:
        stop.set()
        await asyncio.gather(*hogs)
    assert trips.count == operations

    for c in range(COMMUNITIES):
        cid = f"discord:{c}"
        store = db.community(cid)
        versions = [v.version for v in await store.versions(limit=100)]
        assert versions == list(range(PER_COMMUNITY - 1, -1, -1))
        assert await store.pending_interactions() == []
        assert await store.pending_episodes() == []
        assert len(await store.audit_events(limit=1000)) == 3 * PER_COMMUNITY
        # one reply usage per interaction + 3 records per commit, none lost or doubled
        assert (await db.usage_totals(cid)).calls == PER_COMMUNITY * 4
        assert len(written_ids[cid]) == 3 * PER_COMMUNITY  # every episode queued, then acked
    assert len(await db.community_ids()) == COMMUNITIES
