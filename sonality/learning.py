"""The learning queue: answered messages post-processed one at a time, in order.

Each interaction was recorded in the store's outbox before its reply left; the queue
runs the agent's post-processing on it, and the commit that ends it acknowledges the
outbox row. A crash in between leaves the row pending for the next start.

The model being unavailable (an outage, a spending limit) is not the interaction's
fault: it is retried, in order, until the model answers, so no evidence is lost and no
later message is learned before it. Any other failure counts as an attempt, and the
store parks the interaction after `MAX_LEARNING_ATTEMPTS`.

Several processes sharing one store (the store hands out a `LearningLease`): any of
them may answer a community's messages, but only the holder of the community's lease
learns, and it learns the store's outbox, in the store's order, not its own queue. A
queued record is then only a wake-up: the worker takes the lease (or leaves the work to
the process holding it), brings the state up to the stored latest version, learns
every pending row, and lets go. After letting go it looks at the outbox once more: a row
recorded by another process while it held the lease, whose own try failed because of
it, is picked up then. A process that dies holding the lease loses it with its
connection; its rows are found by the next wake-up (a new message, or the host's
periodic sweep of outboxes left waiting).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
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

#: Learning that waits for the model retries after this long, doubling up to the cap
#: (a provider's own `retry_after`, e.g. a spending limit's midnight, is capped too, so
#: a raised limit or a recovered provider is noticed within minutes).
LEARNING_RETRY_FIRST = 1.0
LEARNING_RETRY_CAP = 300.0

#: Post-processes one interaction; fills the list with the usage of its LLM calls.
Learn = Callable[[InteractionRecord, list[UsageRecord]], Awaitable[None]]

#: Brings the in-memory state up to the stored latest version (with the lease held);
#: True when another process had committed a newer one.
CatchUp = Callable[[], Awaitable[bool]]


class LearningQueue:
    """One community's unlearned interactions and the single worker that learns them."""

    def __init__(
        self,
        learn: Learn,
        *,
        lock: asyncio.Lock,
        store: StateStore,
        skip: Callable[[InteractionRecord], bool],
        label: str,
        lease: LearningLease | None = None,
        catch_up: CatchUp | None = None,
    ) -> None:
        self._learn_one = learn
        self._lock = lock  # the agent's: learning waits for rollbacks and reflections
        self._store = store
        self._skip = skip
        self.label = label
        self._lease = lease
        self._catch_up = catch_up
        # Records to learn; with a lease, wake-ups (None: "look at the outbox").
        self._queue: asyncio.Queue[InteractionRecord | None] = asyncio.Queue()
        self._worker: asyncio.Task[None] | None = None
        self._current: InteractionRecord | None = None
        # Set while the head of the queue waits for the model; `resume` wakes it.
        self._held = asyncio.Event()
        self._resume = asyncio.Event()

    def put(self, record: InteractionRecord | None) -> None:
        """Queue `record` for learning (shared store: a wake-up; None wakes only)."""
        if record is None and self._lease is None:
            return
        self._queue.put_nowait(record)
        if self._worker is None or self._worker.done():
            self._worker = asyncio.create_task(self._work(), name=f"sonality-post:{self.label}")

    async def settled(self) -> None:
        """Return once the queue is empty or its head waits for the model."""
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
    def backlog(self) -> int:
        return self._queue.qsize() + (1 if self._current is not None else 0)

    async def close(self, grace_seconds: float) -> None:
        """Learn what is queued (bounded), then stop; the rest is replayed on next load."""
        try:
            await asyncio.wait_for(self._queue.join(), grace_seconds)
        except TimeoutError:
            log.warning("%s: %d interaction(s) left for replay", self.label, self._queue.qsize())
        if self._worker is not None:
            self._worker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._worker

    async def _work(self) -> None:
        while True:
            record = await self._queue.get()
            if self._lease is not None:
                await self._learn_shared(self._lease)
                continue
            assert record is not None
            self._current = record
            try:
                if not self._skip(record):
                    await self._learn(record)
            finally:
                self._current = None
                self._queue.task_done()

    async def _learn_shared(self, lease: LearningLease) -> None:
        """Learn the store's outbox if this process gets the lease (see the module doc).
        Called with one wake-up taken from the queue; marks every wake-up it answered
        done once the outbox it saw is learned, so `settled` means what it says."""
        answered = 1
        try:
            while True:
                while not self._queue.empty():  # wake-ups so far are all answered by this
                    self._queue.get_nowait()
                    answered += 1
                if not await lease.acquire():
                    log.debug("%s: another process learns; its holder sees our rows", self.label)
                    return
                try:
                    if self._catch_up is not None:
                        async with self._lock:
                            await self._catch_up()
                    tried = await self._learn_outbox()
                finally:
                    await lease.release()
                if all(r.id in tried for r in await self._unskipped_pending()):
                    return
        except asyncio.CancelledError:
            raise
        except Exception:
            # The store unreachable: the next wake-up (a message, the sweep) tries again.
            log.exception("%s: learning from the shared outbox failed", self.label)
        finally:
            for _ in range(answered):
                self._queue.task_done()

    async def _unskipped_pending(self) -> list[InteractionRecord]:
        return [r for r in await self._store.pending_interactions() if not self._skip(r)]

    async def _learn_outbox(self) -> set[str]:
        """Learn pending rows, oldest first, until none is left (rows recorded meanwhile,
        by any process, included); returns the ids tried."""
        # Each row once per round: one that failed for good has left the outbox, and one
        # whose failure could not even be recorded must not be retried in a tight loop.
        tried: set[str] = set()
        while True:
            pending = [r for r in await self._unskipped_pending() if r.id not in tried]
            if not pending:
                return tried
            for record in pending:
                tried.add(record.id)
                self._current = record
                try:
                    await self._learn(record)
                finally:
                    self._current = None

    async def _learn(self, record: InteractionRecord) -> None:
        delay = LEARNING_RETRY_FIRST
        while True:
            usage: list[UsageRecord] = []  # filled by each LLM call of the attempt
            try:
                async with self._lock:
                    await self._learn_one(record, usage)
                return
            except asyncio.CancelledError:
                raise
            except LLMError as exc:
                wait = exc.retry_after if exc.retry_after is not None else delay
                wait = min(max(wait, LEARNING_RETRY_FIRST), LEARNING_RETRY_CAP)
                log.warning(
                    "%s: learning of %s waits %.0fs for the model (%s)",
                    self.label,
                    record.id,
                    wait,
                    exc,
                )
                await self._record_spent(usage)
                await self._hold(wait)
            except Exception as exc:
                if self._lease is not None and await self._overtaken(record):
                    # Another process committed meanwhile (its lock was thought lost):
                    # not this interaction's fault, so no attempt is counted; if it
                    # learned this very interaction, there is nothing left to do.
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
                    return
                await self._hold(delay)
            delay = min(delay * 2, LEARNING_RETRY_CAP)

    async def _overtaken(self, record: InteractionRecord) -> bool:
        """Shared store: whether another process learned `record` or stored a newer
        state than this attempt started from (which is then adopted)."""
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
