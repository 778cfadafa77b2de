"""Nightly and idle-time reflection, on APScheduler's own triggers.

Reflection is the expensive, slow part of learning, so it runs when nobody is
waiting: once a night for every community that talked since its last reflection, and
when a community has gone quiet with insights still waiting to be folded in. A
community never has two scheduled reflections running at once.

Several processes on one PostgreSQL database each run this scheduler; every job that
touches shared data (the nightly reflection, housekeeping's deletions, one community's
idle reflection) runs under a lock of its own in the database (`Database.job_run`), so
a process that does not get it skips that run instead of repeating it. Housekeeping
also sweeps outboxes whose rows wait with no learner (a process died holding the
community's learning) and wakes their learning here. On SQLite nothing of this applies.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from typing import Any, Literal
from zoneinfo import ZoneInfo

from apscheduler.schedulers.asyncio import AsyncIOScheduler
from apscheduler.triggers.cron import CronTrigger
from apscheduler.triggers.interval import IntervalTrigger

from bot.deletion import resume_deletions
from bot.forget_me import resume_forgets
from bot.messages import Community
from bot.runtime import Runtime
from sonality.agent import SonalityAgent
from sonality.store import utcnow
from storage import RetentionPolicy, RetentionReport

log = logging.getLogger(__name__)

Clock = Callable[[], datetime]

RETENTION_EVERY = timedelta(hours=1)
"""How often housekeeping applies the retention settings (they count in days)."""

ABANDONED_AFTER = timedelta(minutes=15)
"""A forget-me or message deletion still open this long after it began was abandoned
(its process died, or it failed): housekeeping finishes it. Far longer than one takes
(seconds, on a community of 100,000 interactions)."""

ORPHAN_AFTER = timedelta(seconds=5)
"""An interaction answered this long ago and still not learned, with several processes,
may have lost its learner (a process killed mid-learning): the sweep wakes learning for
its community. Waking a community whose learner is alive costs one lock attempt."""


class ReflectionScheduler:
    def __init__(self, runtime: Runtime, clock: Clock = utcnow) -> None:
        settings = runtime.settings
        self.runtime = runtime
        self.clock = clock
        self.tz = ZoneInfo(settings.timezone)
        at = settings.nightly_at
        self.nightly_trigger = CronTrigger(
            hour=at.hour,
            minute=at.minute,
            second=at.second,
            timezone=self.tz,
            jitter=settings.nightly_jitter_seconds or None,
        )
        self.idle_trigger = IntervalTrigger(seconds=settings.idle_check_seconds, timezone=self.tz)
        self._scheduler: AsyncIOScheduler | None = None
        self._running: set[str] = set()
        self._in_flight: set[asyncio.Task[Any]] = set()
        # Community -> the last message time its idle reflection was tried for.
        self._idle_tried: dict[str, datetime] = {}
        self._retention_at: datetime | None = None  # when retention last ran

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        # APScheduler's job defaults already coalesce missed runs and allow one instance.
        scheduler = AsyncIOScheduler(timezone=self.tz)
        scheduler.add_job(
            self._job(self.run_nightly),
            self.nightly_trigger,
            id="nightly-reflection",
            misfire_grace_time=3600,
        )
        scheduler.add_job(self._job(self.run_housekeeping), self.idle_trigger, id="idle-reflection")
        scheduler.start()
        self._scheduler = scheduler
        self._publish_next()
        log.info("next nightly reflection: %s", _utc(self.runtime.next_nightly))

    async def stop(self) -> None:
        """Stop the jobs before the runtime closes under them: none starts after this
        returns and none is still running.

        APScheduler 3's asyncio scheduler only queues its shutdown on the loop, and a
        wakeup its timer queued before still runs: with jobs left it would start them
        and arm its timer again, so housekeeping ran on into the runtime's close (and a
        job task the closing loop never ran printed "coroutine ... was never awaited").
        """
        scheduler, self._scheduler = self._scheduler, None
        if scheduler is None or not scheduler.running:
            return
        scheduler.remove_all_jobs()
        scheduler.shutdown(wait=False)  # cancels the job tasks it started, once it runs
        await asyncio.sleep(0)  # let the queued shutdown run
        await asyncio.gather(*self._in_flight, return_exceptions=True)

    def _job(self, run: Callable[[], Awaitable[object]]) -> Callable[[], Awaitable[None]]:
        """`run` as a scheduled job whose task `stop()` can wait for."""

        async def job() -> None:
            task = asyncio.current_task()
            assert task is not None
            self._in_flight.add(task)
            try:
                await run()
            finally:
                self._in_flight.discard(task)

        job.__qualname__ = getattr(run, "__qualname__", "job")  # APScheduler logs the name
        return job

    def next_nightly(self, now: datetime | None = None) -> datetime | None:
        if self._scheduler is not None:
            job = self._scheduler.get_job("nightly-reflection")
            if job is not None and job.next_run_time is not None:
                return job.next_run_time.astimezone(UTC)
        fire = self.nightly_trigger.get_next_fire_time(
            None, (now or self.clock()).astimezone(self.tz)
        )
        return fire.astimezone(UTC) if fire else None

    def _publish_next(self) -> None:
        self.runtime.next_nightly = self.next_nightly()

    # ------------------------------------------------------------------ jobs
    async def run_nightly(self, now: datetime | None = None) -> list[str]:
        """Reflect (with decay) every community active since its last reflection."""
        now = now or self.clock()
        done: list[str] = []
        async with self.runtime.db.job_run("nightly") as mine:
            if not mine:
                log.info("nightly reflection: another process runs it")
            else:
                due = await self.runtime.db.communities_needing_nightly()
                failed = 0
                for community_id in due:
                    # `_reflect` catches its own errors: one community's failure never
                    # stops the others' reflections.
                    result = await self._reflect(community_id, "nightly", now)
                    if result == "reflected":
                        done.append(community_id)
                    elif result == "failed":
                        failed += 1
                log.info(
                    "nightly reflection: %d of %d community(ies) reflected", len(done), len(due)
                )
                if failed:
                    log.warning(
                        "nightly reflection: %d community(ies) failed; tried again next time",
                        failed,
                    )
        self._publish_next()
        return done

    async def run_idle(self, now: datetime | None = None) -> list[str]:
        """Reflect loaded communities that went quiet with insights waiting. Returns the
        communities whose reflection was tried, even if the model failed it (the next
        nightly run tries again: a failed reflection is not marked done)."""
        now = now or self.clock()
        quiet_for = timedelta(minutes=self.runtime.settings.idle_reflect_minutes)
        done = []
        for community_id, agent in list(self.runtime.registry.loaded().items()):
            last = self.runtime.last_message_at.get(community_id)
            if last is None or now - last < quiet_for or not agent.sponge.pending_insights:
                continue
            # One try per quiet spell: a reflection that failed (the model down, the
            # limit reached) waits for new conversation instead of paying every minute.
            if self._idle_tried.get(community_id) == last:
                continue
            self._idle_tried[community_id] = last
            try:  # one community's trouble must not stop the others' (nor housekeeping)
                async with self.runtime.db.job_run(f"idle:{community_id}") as mine:
                    if not mine:
                        continue
                    await agent.catch_up()  # another process may have reflected it already
                    if agent.sponge.pending_insights and (
                        await self._reflect(community_id, "idle", now, agent) != "skipped"
                    ):
                        done.append(community_id)
            except Exception:
                log.exception("idle reflection for %s failed", community_id)
        return done

    async def run_housekeeping(self, now: datetime | None = None) -> None:
        """Idle reflection, unloading idle agents, forgetting expired conversation,
        waking learning that waited for a new day's budget, and (hourly) deleting what
        the retention settings say is old enough."""
        now = now or self.clock()
        self.resume_after_midnight()
        await self.wake_orphans(now)
        await self.run_idle(now)
        await self.runtime.registry.evict_idle()
        self.runtime.rate_limiter.forget_idle()
        async with self.runtime.db.job_run("housekeeping") as mine:
            if mine:
                await self._shared_housekeeping(now)
            else:
                log.debug("housekeeping: another process runs it")

    async def _shared_housekeeping(self, now: datetime) -> None:
        """What deletes shared data: one process at a time."""
        await self.runtime.db.prune_turns(
            now - timedelta(minutes=self.runtime.settings.buffer_ttl_minutes)
        )
        shared = self.runtime.shared_limiter
        if shared is not None:
            try:
                await shared.prune(now)
            except Exception:
                log.exception("pruning the shared flood count failed; tried again next time")
        try:
            await self.run_retention(now)
        except Exception:
            log.exception("retention failed; it is tried again at the next housekeeping")
        try:
            await self.runtime.budget.prune_members()  # past days' shares: member data
        except Exception:
            log.exception("pruning the members' spend failed; tried again next time")
        try:
            # Communities the bot was removed from, once SONALITY_DELETE_AFTER_REMOVAL_DAYS
            # have passed without it being added back (bot/community_removal.py).
            await self.runtime.removals.erase_due(now)
        except Exception:
            log.exception("erasing removed communities failed; tried again next time")
        try:
            await self.finish_abandoned_erasures(now)
        except Exception:
            log.exception("finishing abandoned forget-mes failed; tried again next time")

    async def finish_abandoned_erasures(self, now: datetime) -> None:
        """Forget-mes and message deletions begun `ABANDONED_AFTER` ago and still open:
        the process running them died and was not started again (several processes), or
        the request failed (the member saw an error). Start-up finishes them too; this
        does it without waiting for a start, while replies would still recall them."""
        before = now - ABANDONED_AFTER
        registry = self.runtime.registry
        await resume_forgets(
            self.runtime.db,
            registry.agent_by_id,
            self.runtime.forget_journal,
            started_before=before,
        )
        await resume_deletions(self.runtime.db, registry.agent_by_id, started_before=before)

    async def wake_orphans(self, now: datetime) -> list[str]:
        """With several processes: wake learning for communities whose outbox has rows
        older than ORPHAN_AFTER (their learner may have died); the lease decides who
        learns them. Returns the communities woken."""
        db = self.runtime.db
        if db.coordinator is None:
            return []  # one process: it replays its own outbox at start
        woken = []
        for community_id in await db.communities_waiting_to_learn(now - ORPHAN_AFTER):
            if self.runtime.removals.is_removed(community_id):
                continue  # the bot left it: its data waits for erasure, not learning
            try:
                agent = self.runtime.registry.get(community_id)
                if agent is None:  # loading it queues its outbox
                    await self.runtime.registry.agent_for(Community(id=community_id))
                else:
                    await agent.wake_learning()
                woken.append(community_id)
            except Exception:
                log.exception("could not wake the learning of %s", community_id)
        if woken:
            # Debug: while the model is down every waiting community is listed each time.
            log.debug("woke learning left waiting in %d community(ies)", len(woken))
        return woken

    async def run_retention(self, now: datetime) -> RetentionReport | None:
        """Apply SONALITY_MESSAGE_RETENTION_DAYS and SONALITY_AUDIT_RETENTION_DAYS at
        `now` (see `storage.retention`), unless it ran less than RETENTION_EVERY ago;
        None when it did not run."""
        last = self._retention_at
        if last is not None and last <= now < last + RETENTION_EVERY:
            return None
        settings = self.runtime.settings
        report = await self.runtime.db.apply_retention(
            now,
            RetentionPolicy(
                message_days=settings.message_retention_days,
                audit_days=settings.audit_retention_days,
            ),
        )
        self._retention_at = now
        if report.total:
            log.info("retention: %s", report.describe())
        return report

    def resume_after_midnight(self) -> list[str]:
        """Wake the loaded agents of communities whose day (and so their spending) just
        started anew: learning held back by the limit goes on at once instead of when
        its own retry timer fires. Returns the communities woken."""
        woken = []
        for community_id in self.runtime.budget.roll_over():
            agent = self.runtime.registry.get(community_id)
            if agent is not None:
                agent.resume_learning()
                woken.append(community_id)
        if woken:
            log.info("new day: resumed learning in %d community(ies)", len(woken))
        return woken

    async def _reflect(
        self, community_id: str, trigger: str, now: datetime, agent: SonalityAgent | None = None
    ) -> Literal["reflected", "failed", "skipped"]:
        """Reflect one community. A loaded agent is used as it is: looking it up through
        the registry would count as use and keep an idle community from being evicted.

        Only a reflection that ran is marked done: one the model failed (or that raised)
        leaves the community due, so the next nightly run tries it again. Never raises
        for one community's trouble, so a job goes on with the others."""
        if community_id in self._running:
            log.info("%s reflection for %s skipped: one is running", trigger, community_id)
            return "skipped"
        self._running.add(community_id)
        try:
            if self.runtime.removals.is_removed(community_id):
                # The bot left it: its data waits for erasure; loading it would pay the
                # model to reflect a community nobody talks to.
                log.info("%s reflection for %s skipped: removed", trigger, community_id)
                return "skipped"
            if await self.runtime.budget.exhausted(community_id):
                # Reflection needs the model, and the learning it would wait for is held
                # until midnight: waiting here would stall every other community's job.
                log.info(
                    "%s reflection for %s skipped: spending limit reached", trigger, community_id
                )
                return "skipped"
            if agent is None:
                agent = self.runtime.registry.get(community_id)
            if agent is None:
                agent = await self.runtime.registry.agent_for(Community(id=community_id))
            await agent.drain()
            outcome = await agent.reflect_now(trigger)
            if not outcome.ran:
                log.warning(
                    "%s reflection for %s failed (%s); tried again next time",
                    trigger,
                    community_id,
                    outcome.error or "not run",
                )
                return "failed"
            await self.runtime.db.mark_reflected(community_id, now)
            log.info(
                "%s reflection for %s: ran=%s accepted=%s",
                trigger,
                community_id,
                outcome.ran,
                outcome.accepted,
            )
            return "reflected"
        except Exception:
            log.exception("%s reflection for %s failed", trigger, community_id)
            return "failed"
        finally:
            self._running.discard(community_id)


def _utc(at: datetime | None) -> str:
    return "none" if at is None else at.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
