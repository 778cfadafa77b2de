"""Nightly and idle-time reflection, driven with a controllable clock."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

from app.wiring import open_runtime
from bot.scheduler import ReflectionScheduler
from tests.integration.conftest import A, B, command, make_settings, say
from tests.stack import on_every_stack

#: Every test here runs on the embedded default and on PostgreSQL + a Chroma server.
pytestmark = on_every_stack

T0 = datetime(2026, 11, 23, 12, 0, tzinfo=UTC)


def reflection_requests(server) -> list:
    return [r for r in server.requests if "current_self_description" in r.user_text]


def scheduler_for(runtime) -> ReflectionScheduler:
    return ReflectionScheduler(runtime, clock=lambda: T0)


async def test_nightly_reflects_only_communities_active_since_last_reflection(
    runtime, anthropic_server
):
    await say(runtime, "hello alpha", community=A)
    await say(runtime, "hello beta", community=B)
    await runtime.db.mark_reflected(B.id, datetime.now(UTC) + timedelta(seconds=1))
    scheduler = scheduler_for(runtime)
    done = await scheduler.run_nightly(datetime.now(UTC) + timedelta(hours=1))
    assert done == [A.id]
    assert len(reflection_requests(anthropic_server)) == 1
    events = await runtime.db.community(A.id).audit_events(kind="reflection")
    assert events[0].payload["trigger"] == "nightly"
    assert await runtime.db.community(B.id).audit_events(kind="reflection") == []
    # Nothing new happened: the next night spends no tokens.
    assert await scheduler.run_nightly(datetime.now(UTC) + timedelta(days=1)) == []


async def test_jobs_never_overlap_for_one_community(runtime, anthropic_server):
    await say(runtime, "hello alpha", community=A)
    anthropic_server.latency = 0.3
    scheduler = scheduler_for(runtime)
    later = datetime.now(UTC) + timedelta(hours=1)
    first, second = await asyncio.gather(scheduler.run_nightly(later), scheduler.run_nightly(later))
    assert sorted(first + second) == [A.id]
    assert len(reflection_requests(anthropic_server)) == 1


async def test_idle_reflection_needs_quiet_and_pending_insights(runtime, anthropic_server):
    anthropic_server.brain.ess_rule(
        contains="randomised trial",
        score=0.7,
        direction="supports",
        topics=["tutoring"],
        novelty=0.8,
    )
    await say(runtime, "A randomised trial showed tutoring lifts maths scores.", community=A)
    await say(runtime, "just chatting", community=B)
    assert runtime.registry.get(A.id).sponge.pending_insights
    assert not runtime.registry.get(B.id).sponge.pending_insights
    last = runtime.last_message_at[A.id]
    scheduler = scheduler_for(runtime)
    assert await scheduler.run_idle(last + timedelta(minutes=10)) == []
    assert await scheduler.run_idle(last + timedelta(minutes=31)) == [A.id]
    [event] = await runtime.db.community(A.id).audit_events(kind="reflection")
    assert event.payload["trigger"] == "idle"
    assert runtime.registry.get(A.id).sponge.pending_insights == []


async def test_nightly_trigger_honours_hour_and_timezone(tmp_path, llm):
    settings = make_settings(
        tmp_path / "data", SONALITY_NIGHTLY_HOUR=4, SONALITY_TIMEZONE="Europe/Helsinki"
    )
    async with open_runtime(settings, llm=llm) as runtime:
        scheduler = ReflectionScheduler(runtime)
        # 04:00 in Helsinki (UTC+2 in November) is 02:00 UTC.
        assert scheduler.next_nightly(T0) == datetime(2026, 11, 24, 2, 0, tzinfo=UTC)
        scheduler.start()
        try:
            assert runtime.next_nightly is not None
            assert runtime.next_nightly.astimezone(UTC).hour == 2
            status = await command(runtime, "status")
            assert "nightly run" in status.text and "02:00 UTC" in status.text
        finally:
            await scheduler.stop()


async def test_no_job_runs_after_shutdown_even_with_a_wakeup_already_queued(tmp_path, llm):
    """APScheduler 3 runs a wakeup that its timer queued on the loop even after
    `shutdown()`: with jobs left it starts them and arms its timer again, so housekeeping
    kept running into the runtime's close (a job task left pending when the loop closed
    is what printed "coroutine ... was never awaited" on stderr)."""
    settings = make_settings(tmp_path / "data", SONALITY_IDLE_CHECK_SECONDS="0.05")
    async with open_runtime(settings, llm=llm) as runtime:
        scheduler = ReflectionScheduler(runtime)
        runs: list[float] = []

        async def housekeeping(now: datetime | None = None) -> None:
            runs.append(asyncio.get_running_loop().time())

        scheduler.run_housekeeping = housekeeping  # type: ignore[method-assign]
        scheduler.start()
        await asyncio.sleep(0.3)
        assert runs, "the idle job runs every 0.05 s while the scheduler runs"
        apscheduler = scheduler._scheduler
        assert apscheduler is not None
        apscheduler.wakeup()  # what its timer does: queued on the loop, runs later
        await scheduler.stop()
        before = len(runs)
        await asyncio.sleep(0.5)
        assert len(runs) == before, "housekeeping ran after shutdown"
        assert getattr(apscheduler, "_timeout", None) is None, "its timer was armed again"


async def test_nightly_time_sets_the_minute_and_second(tmp_path, llm):
    settings = make_settings(
        tmp_path / "data", SONALITY_NIGHTLY_TIME="04:30:15", SONALITY_TIMEZONE="Europe/Helsinki"
    )
    async with open_runtime(settings, llm=llm) as runtime:
        scheduler = ReflectionScheduler(runtime)
        assert scheduler.next_nightly(T0) == datetime(2026, 11, 24, 2, 30, 15, tzinfo=UTC)
        # Before that time of the same day: that day.
        early = datetime(2026, 11, 24, 2, 30, 14, tzinfo=UTC)
        assert scheduler.next_nightly(early) == datetime(2026, 11, 24, 2, 30, 15, tzinfo=UTC)


async def test_housekeeping_forgets_expired_conversation(runtime, anthropic_server):
    await say(runtime, "remember my tea", community=A)
    now = datetime.now(UTC)
    assert await runtime.db.recent_turns(A.id, "u-alice", max_turns=10, max_chars=1000)
    scheduler = scheduler_for(runtime)
    await scheduler.run_housekeeping(now + timedelta(minutes=30))
    assert await runtime.db.recent_turns(A.id, "u-alice", max_turns=10, max_chars=1000)
    ttl = runtime.settings.buffer_ttl_minutes
    await scheduler.run_housekeeping(now + timedelta(minutes=ttl + 1))
    assert await runtime.db.recent_turns(A.id, "u-alice", max_turns=10, max_chars=1000) == []
