"""Flood control across processes on one PostgreSQL database (issue #14).

The in-process limiter sees only the messages its process received; behind a load
balancer a member would get the limit once per process. With DATABASE_URL the count is
shared (`bot.ratelimit.SharedRateLimiter`, `storage.flood`); when the database fails the
in-process count takes over, and replies never wait on it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from app.wiring import open_runtime
from bot import ratelimit
from bot.messages import SLOW_DOWN
from bot.ratelimit import RateLimiter, SharedRateLimiter, Verdict
from bot.scheduler import ReflectionScheduler
from storage import Database
from tests.chroma_server import ChromaServer, chroma_server  # noqa: F401 (fixture)
from tests.integration.conftest import make_settings, say
from tests.integration.test_logging import Output
from tests.integration.test_multi_process import (  # noqa: F401 (fixture "two_bots")
    BotProcess,
    TwoBotStack,
    two_bots,
)
from tests.pg import PostgresServer
from tests.slack.conftest import fake_slack, http_session  # noqa: F401 (fixtures)

T0 = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
CID = "slack:T1"
MEMBER = "U0FLOOD"


class Clock:
    def __init__(self) -> None:
        self.now = T0
        self.mono = 1000.0

    def wall(self) -> datetime:
        return self.now

    def monotonic(self) -> float:
        return self.mono


@pytest.fixture
async def pg_url(postgres_server: PostgresServer) -> AsyncIterator[str]:
    url = postgres_server.new_database()
    try:
        yield url
    finally:
        postgres_server.drop(url)


def limiter(db: Database, clock: Clock, limit: int = 2, window: float = 10.0) -> SharedRateLimiter:
    local = RateLimiter(limit, window, clock=clock.monotonic)
    return SharedRateLimiter(db, local, clock=clock.wall, monotonic=clock.monotonic)


def said(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "bot.ratelimit"]


async def test_two_processes_count_one_members_flood_together(pg_url: str) -> None:
    clock = Clock()
    first, second = await Database.open_url(pg_url), await Database.open_url(pg_url)
    try:
        one, two = limiter(first, clock), limiter(second, clock)
        verdicts = [await (one if i % 2 == 0 else two).check(CID, MEMBER) for i in range(5)]
        # Each process saw at most three messages: alone, each would have allowed two.
        assert verdicts == [
            Verdict.ALLOW,
            Verdict.ALLOW,
            Verdict.WARN,
            Verdict.DROP,
            Verdict.DROP,
        ]
        assert await two.check(CID, "U0CALM") is Verdict.ALLOW  # per member
        assert await one.check("slack:T2", MEMBER) is Verdict.ALLOW  # per community
        clock.now += timedelta(seconds=10)  # the window is over
        assert await two.check(CID, MEMBER) is Verdict.ALLOW
        # Housekeeping at the end of the window of the calm member's first message.
        assert await one.prune(T0 + timedelta(seconds=10)) == 2
    finally:
        await first.close()
        await second.close()


async def test_a_flood_across_a_window_boundary_gets_no_fresh_limit(pg_url: str) -> None:
    """One message, then the rest of the limit just before the window ends, then more
    right after: with fixed windows the member got the whole limit again. Two
    processes, one notice."""
    clock = Clock()
    first, second = await Database.open_url(pg_url), await Database.open_url(pg_url)
    try:
        one, two = limiter(first, clock), limiter(second, clock)
        assert await one.check(CID, MEMBER) is Verdict.ALLOW
        clock.now = T0 + timedelta(seconds=9.5)
        assert await two.check(CID, MEMBER) is Verdict.ALLOW
        clock.now = T0 + timedelta(seconds=10)  # a new window; the first message expired
        verdicts = [await (one if i % 2 else two).check(CID, MEMBER) for i in range(4)]
        assert verdicts == [Verdict.ALLOW, Verdict.WARN, Verdict.DROP, Verdict.DROP]
        # Once the previous window's messages are a window old, the member is free again.
        clock.now = T0 + timedelta(seconds=19.5)
        assert await one.check(CID, MEMBER) is Verdict.DROP  # four in this window
        clock.now = T0 + timedelta(seconds=20)
        assert await two.check(CID, MEMBER) is Verdict.ALLOW
    finally:
        await first.close()
        await second.close()


async def test_a_database_that_hangs_or_fails_falls_back_to_the_process_count(
    pg_url: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A flood table locked by another session stands for a stuck database: the message
    is judged by the in-process count instead of waiting, the log says why once, and
    the database is asked again after RETRY_SHARED_SECONDS."""
    import psycopg

    monkeypatch.setattr(ratelimit, "SHARED_TIMEOUT_SECONDS", 0.05)
    clock = Clock()
    db = await Database.open_url(pg_url)
    shared = limiter(db, clock)
    caplog.set_level(logging.WARNING, logger="bot.ratelimit")
    try:
        assert await shared.check(CID, MEMBER) is Verdict.ALLOW  # counted in the database
        with psycopg.connect(pg_url) as blocker:
            blocker.execute("LOCK TABLE flood_windows IN ACCESS EXCLUSIVE MODE")
            # Stuck: the in-process count (which saw the first message too) decides.
            assert await shared.check(CID, MEMBER) is Verdict.ALLOW
            assert await shared.check(CID, MEMBER) is Verdict.WARN
            assert await shared.check(CID, MEMBER) is Verdict.DROP
            warnings = said(caplog)
            assert len(warnings) == 1 and "no answer in 0.05 s" in warnings[0], warnings
            assert len(shared._pending) == 1  # asked once; then not while it is down
            blocker.commit()
        # The upsert that waited now ends on its own.
        await asyncio.gather(*shared._pending, return_exceptions=True)
        clock.mono += ratelimit.RETRY_SHARED_SECONDS
        # Asked again: the database counted the first message and the one that waited.
        assert await shared.check(CID, MEMBER) is Verdict.WARN
        assert "answers again" in said(caplog)[-1]
        await db.close()
        # A failing database (here: closed) is reported and the process count used.
        caplog.clear()
        clock.mono += ratelimit.RETRY_SHARED_SECONDS
        assert await shared.check(CID, "U0OTHER") is Verdict.ALLOW
        assert ["closed" in line for line in said(caplog)] == [True]
    finally:
        await db.close()


async def test_on_sqlite_the_limit_stays_in_memory(
    tmp_path: Path, llm: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One process on SQLite: no shared limiter, no flood rows, the same verdicts."""

    async def never(*args: object) -> int:
        raise AssertionError("the SQLite bot asked the database for a flood count")

    monkeypatch.setattr(Database, "flood_hit", never)
    settings = make_settings(tmp_path / "data", llm=llm, SONALITY_RATE_LIMIT_MESSAGES=1)
    async with open_runtime(settings, llm=llm) as runtime:
        assert runtime.db.coordinator is None and runtime.shared_limiter is None
        assert (await say(runtime, "first")) is not None
        flood = await say(runtime, "second")
        assert flood is not None and flood.text == SLOW_DOWN


async def test_the_runtime_on_postgresql_counts_in_the_database_and_housekeeping_prunes(
    tmp_path: Path, pg_url: str, llm: Any
) -> None:
    settings = make_settings(
        tmp_path / "data", llm=llm, DATABASE_URL=pg_url, SONALITY_RATE_LIMIT_MESSAGES=1
    )
    async with open_runtime(settings, llm=llm) as runtime:
        assert runtime.shared_limiter is not None
        assert (await say(runtime, "first")) is not None
        flood = await say(runtime, "second")
        assert flood is not None and flood.text == SLOW_DOWN
        rows = await runtime.db._fetchall("SELECT hits FROM flood_windows")
        assert rows == [(2,)]
        window = timedelta(seconds=settings.rate_limit_window_seconds)
        scheduler = ReflectionScheduler(runtime)
        await scheduler.run_housekeeping(datetime.now(UTC))  # the window is not over
        assert await runtime.db._fetchall("SELECT hits FROM flood_windows") == [(2,)]
        await scheduler.run_housekeeping(datetime.now(UTC) + window)
        assert await runtime.db._fetchall("SELECT hits FROM flood_windows") == []


# --- two real bot processes -------------------------------------------------------------


async def lines_with(out: Output, needle: str, count: int) -> None:
    """Wait until `needle` appears in `count` lines of the process's output."""

    async def seen() -> None:
        while sum(needle in line for line in out.lines) < count:
            out.changed.clear()
            await out.changed.wait()

    try:
        await asyncio.wait_for(seen(), 120)
    except TimeoutError:
        raise AssertionError(
            f"never logged {needle!r} {count} time(s): {out.lines[-20:]}"
        ) from None


async def test_a_members_flood_spread_over_two_processes_meets_one_limit(
    two_bots: TwoBotStack,  # noqa: F811
) -> None:
    limit = 3
    settings = {
        "SONALITY_RATE_LIMIT_MESSAGES": str(limit),
        "SONALITY_RATE_LIMIT_WINDOW_SECONDS": "3600",  # no window ends during the test
    }
    a = await two_bots.start("a", **settings)
    b = await two_bots.start("b", **settings)
    pick: Callable[[int], BotProcess] = lambda i: a if i % 2 == 0 else b  # noqa: E731
    answered = []
    for i in range(limit):  # a, b, a: within the limit, every one is answered
        ts = await two_bots.mention(pick(i), f"<@UBOT> point number {i}")
        await two_bots.answered(ts)
        answered.append(ts)
    # The fourth reaches b, which itself saw only one message: the member is told once.
    ts = await two_bots.mention(pick(limit), "<@UBOT> and another")
    await two_bots.answered(ts)
    [notice] = two_bots.replies_to(ts)
    assert notice["text"] == SLOW_DOWN, notice
    # The rest of the flood, on both processes, is dropped without a word.
    for i in range(limit + 1, limit + 5):
        bot = pick(i)
        before = sum("dropping flood message" in line for line in bot.out.lines)
        dropped = await two_bots.mention(bot, f"<@UBOT> more {i}")
        await lines_with(bot.out, "dropping flood message", before + 1)
        assert two_bots.replies_to(dropped) == []
    for ts in answered:
        [reply] = two_bots.replies_to(ts)
        assert reply["text"] != SLOW_DOWN
    assert await two_bots.stop() == [0, 0], [bot.err.lines[-10:] for bot in two_bots.bots]
