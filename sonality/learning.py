"""The learning queue: answered messages post-processed one at a time, in order.

There is one path, whoever else uses the store: the holder of the community's
`LearningLease` learns the store's outbox, oldest row first. A queued entry is only a
wake-up ("look at the outbox"), so a row nobody queued (recorded by another process, or
left by a crash) is learned like any other. A store only this process writes has a
`LocalLease`, and then a round costs one outbox read, and more only if messages came
in meanwhile; with a shared store the holder reads until the outbox is empty and, after
letting go, looks once more for rows another process recorded meanwhile (that process's
wake-up found the lease taken).

A model outage is not the interaction's fault: it is retried in order until the model
answers, so no evidence is lost or reordered. Other failures count as attempts; the
store parks a row after `MAX_LEARNING_ATTEMPTS`. While learning waits to try again, the
lease is let go: a community over its spending limit waits until midnight, and a
forget-me in another process must not wait with it.

A member's forget-me deletes the messages they sent before it, also those waiting
here, and a deleted message goes the same way: `skip` is asked under the agent's lock,
right before a message is learned, so a forget-me or deletion that ran meanwhile is
seen (the store never lists a message whose forget-me or deletion is under way as
pending).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable

from sonality.llm import LLMError
from sonality.store import (
    MAX_LEARNING_ATTEMPTS,
    InteractionRecord,
    LearningLease,
    StateStore,
    UsageRecord,
)

log = logging.getLogger(__name__)

#: Retry delays for learning, doubling up to the cap (which also bounds a provider's
#: `retry_after`, so a recovery is noticed within minutes).
LEARNING_RETRY_FIRST = 1.0
LEARNING_RETRY_CAP = 300.0

#: With a lease other processes share, a holder learning a long outbox lets go after
#: this many seconds, for `LEASE_GAP_SECONDS`, so a forget-me, deletion, rollback or
#: reflection waiting in another process gets its turn (it polls every 0.2 s).
LEASE_TURN_SECONDS = 10.0
LEASE_GAP_SECONDS = 0.5

Learn = Callable[[InteractionRecord, list[UsageRecord]], Awaitable[None]]

#: Adopts a newer stored state; True if there was one.
CatchUp = Callable[[], Awaitable[bool]]


class _Paused(Exception):
    """Learning waits `seconds` (the model down, or a failed attempt): with the lease
    let go meanwhile, so a forget-me, deletion, rollback or reflection in another
    process can take it (they wait two minutes at most, `LEASE_WAIT_SECONDS`)."""

    def __init__(self, seconds: float) -> None:
        super().__init__(seconds)
        self.seconds = seconds


class _Turn(Exception):
    """The holder's turn with a shared lease is over (`LEASE_TURN_SECONDS`)."""


class LearningQueue:
    def __init__(
        self,
        learn: Learn,
        *,
        lock: asyncio.Lock,
        store: StateStore,
        skip: Callable[[InteractionRecord], Awaitable[bool]],
        label: str,
        lease: LearningLease,
        catch_up: CatchUp | None = None,
    ) -> None:
        self._learn_one = learn
        self._lock = lock  # the agent's
        self._store = store
        self._skip = skip
        self.label = label
        self._lease = lease
        self._catch_up = catch_up
        # Wake-ups; each is marked done once a look at the outbox after it has ended.
        self._queue: asyncio.Queue[None] = asyncio.Queue()
        self._worker: asyncio.Task[None] | None = None
        self._answered = 0  # wake-ups the running round has taken
        self._left = 0  # rows the running round has still to learn (1 while it looks)
        self._current: InteractionRecord | None = None
        self._held = asyncio.Event()
        self._resume = asyncio.Event()
        self._delay = LEARNING_RETRY_FIRST  # the next pause after a failure, doubling

    def wake(self) -> None:
        """Have the outbox looked at (a message was recorded, or another process may
        have left rows)."""
        self._queue.put_nowait(None)
        if self._worker is None or self._worker.done():
            self._worker = asyncio.create_task(self._work(), name=f"sonality-post:{self.label}")

    async def settled(self) -> None:
        """Return once every wake-up is answered or the outbox's head waits for the model."""
        join = asyncio.ensure_future(self._queue.join())
        held = asyncio.ensure_future(self._held.wait())
        try:
            await asyncio.wait({join, held}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for waiter in (join, held):
                waiter.cancel()

    @property
    def held(self) -> bool:
        return self._held.is_set()

    def resume(self) -> None:
        self._resume.set()

    @property
    def current(self) -> InteractionRecord | None:
        """The interaction being learned now, if any (a host attributes the model calls
        made meanwhile to its speaker)."""
        return self._current

    @property
    def backlog(self) -> int:
        """Work in sight: wake-ups not yet looked at, and the rows this round has left."""
        return self._queue.qsize() + self._left

    async def close(self, grace_seconds: float) -> None:
        """Learn what is waiting within the grace, then stop."""
        try:
            await asyncio.wait_for(self._queue.join(), grace_seconds)
        except TimeoutError:
            log.warning("%s: %d interaction(s) left for replay", self.label, self.backlog)
        if self._worker is not None:
            self._worker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._worker

    async def _work(self) -> None:
        while True:
            await self._queue.get()
            self._answered = 1
            self._left = 1  # looking
            try:
                await self._round()
            except Exception:
                # The store unreachable: the next wake-up tries again.
                log.exception("%s: learning from the outbox failed", self.label)
            finally:
                self._left = 0
                for _ in range(self._answered):
                    self._queue.task_done()
                self._answered = 0

    def _take_wakeups(self) -> None:
        """Take the wake-ups queued so far: the outbox read that follows answers them."""
        while not self._queue.empty():
            self._queue.get_nowait()
            self._answered += 1

    async def _round(self) -> None:
        """Learn the outbox if the lease is free; the wake-ups this round took are
        marked done only after it, so `settled` means what it says."""
        lease = self._lease
        while True:
            self._take_wakeups()
            if not await lease.acquire():
                log.debug("%s: another holder learns; it sees our rows", self.label)
                return
            try:
                if self._catch_up is not None:
                    async with self._lock:
                        await self._catch_up()
                tried = await self._learn_outbox()
            except _Paused as paused:
                tried, wait, held = None, paused.seconds, True
            except _Turn:
                tried, wait, held = None, LEASE_GAP_SECONDS, False
            finally:
                await lease.release()
            if tried is None:  # the lease let go meanwhile
                if held:
                    await self._hold(wait)
                else:
                    await asyncio.sleep(wait)
                continue
            if not lease.shared:
                # Rows recorded here came with a wake-up. (Another store of the
                # community in this process, refused meanwhile, learns its rows at its
                # next wake-up.)
                return
            if all(r.id in tried for r in await self._store.pending_interactions()):
                return

    async def _learn_outbox(self) -> set[str]:
        """Learn pending rows, oldest first, until none is left; returns the ids tried.
        Each row once, so a failure that could not be recorded is no tight loop. On a
        store only this process writes, rows recorded after a read came with a
        wake-up: without one there is nothing to read again for."""
        tried: set[str] = set()
        turn_ends = time.monotonic() + LEASE_TURN_SECONDS
        while True:
            self._take_wakeups()
            self._left = 1
            pending = [r for r in await self._store.pending_interactions() if r.id not in tried]
            self._left = len(pending)
            if not pending:
                return tried
            for record in pending:
                tried.add(record.id)
                self._current = record
                try:
                    await self._learn(record)
                finally:
                    self._current = None
                # Not when paused: the row is still to learn, and counts (an agent with
                # work in sight is not evicted).
                self._left -= 1
                if self._lease.shared and time.monotonic() >= turn_ends:
                    raise _Turn
            if self._queue.empty() and not self._lease.shared:
                return tried

    async def _learn(self, record: InteractionRecord) -> None:
        """Learn `record`, or raise `_Paused` to be tried again (in order) after a
        pause: the round lets the lease go for it."""
        while True:
            usage: list[UsageRecord] = []
            try:
                async with self._lock:
                    if await self._skip(record):
                        log.info(
                            "%s: %s is not learned (its sender was forgotten, or it was deleted)",
                            self.label,
                            record.id,
                        )
                        self._delay = LEARNING_RETRY_FIRST
                        return
                    await self._learn_one(record, usage)
                self._delay = LEARNING_RETRY_FIRST
                return
            except LLMError as exc:
                wait = exc.retry_after if exc.retry_after is not None else self._delay
                wait = min(max(wait, LEARNING_RETRY_FIRST), LEARNING_RETRY_CAP)
                log.warning(
                    "%s: learning of %s waits %.0fs for the model (%s)",
                    self.label,
                    record.id,
                    wait,
                    exc,
                )
                await self._record_spent(usage)
                self._delay = min(self._delay * 2, LEARNING_RETRY_CAP)
                raise _Paused(wait) from None
            except Exception as exc:
                if await self._overtaken(record):
                    # Another process committed meanwhile: not this interaction's fault.
                    await self._record_spent(usage)
                    if not await self._still_pending(record):
                        return
                    continue
                log.exception("%s: post-processing of %s failed", self.label, record.id)
                try:
                    attempts = await self._store.mark_interaction_failed(
                        record.id, repr(exc), usage
                    )
                except Exception:
                    log.exception("%s: could not record the failure", self.label)
                    return
                if attempts >= MAX_LEARNING_ATTEMPTS:
                    log.error(
                        "%s: gave up on %s after %d attempts", self.label, record.id, attempts
                    )
                    self._delay = LEARNING_RETRY_FIRST
                    return
                wait = self._delay
                self._delay = min(self._delay * 2, LEARNING_RETRY_CAP)
                raise _Paused(wait) from None

    async def _overtaken(self, record: InteractionRecord) -> bool:
        """Whether another process learned `record` or committed a newer state (then
        adopted)."""
        try:
            if not await self._still_pending(record):
                return True
            if self._catch_up is None:
                return False
            async with self._lock:
                return await self._catch_up()
        except Exception:
            log.exception("%s: could not look for a newer state", self.label)
            return False

    async def _still_pending(self, record: InteractionRecord) -> bool:
        return any(r.id == record.id for r in await self._store.pending_interactions())

    async def _hold(self, seconds: float) -> None:
        self._resume.clear()
        self._held.set()
        try:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._resume.wait(), seconds)
        finally:
            self._held.clear()

    async def _record_spent(self, usage: list[UsageRecord]) -> None:
        try:
            await self._store.record_usage(usage)
        except Exception:
            log.exception("%s: could not record the tokens of a held attempt", self.label)
