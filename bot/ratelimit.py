"""Per-user flood control that costs no LLM calls.

A user who sends more than `limit` messages inside `window` seconds gets one short
"slow down" notice; further messages in the same flood are dropped silently, so a
spammer can't make the bot spam back.

One process (SQLite) counts in memory (`RateLimiter`). Several processes on one
PostgreSQL database behind a load balancer would each count only the messages they
happened to receive, letting a member send N times the limit with N processes; there
`SharedRateLimiter` counts in the database (`storage.flood`), and falls back to the
in-process count while the database does not answer.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable
from datetime import datetime, timedelta
from enum import Enum
from typing import TYPE_CHECKING, Any, TypeVar

from sonality.store import utcnow

if TYPE_CHECKING:
    from storage import Database

log = logging.getLogger(__name__)

T = TypeVar("T")


class Verdict(Enum):
    ALLOW = "allow"
    WARN = "warn"  # over the limit: answer once with a notice
    DROP = "drop"  # still over the limit, already warned


class RateLimiter:
    def __init__(
        self, limit: int, window: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.limit = limit
        self.window = window
        self._clock = clock
        self._hits: dict[tuple[str, str], deque[float]] = {}
        self._warned: dict[tuple[str, str], float] = {}

    def check(self, community_id: str, user_id: str) -> Verdict:
        now = self._clock()
        key = (community_id, user_id)
        hits = self._hits.setdefault(key, deque())
        while hits and now - hits[0] >= self.window:
            hits.popleft()
        if len(hits) < self.limit:
            hits.append(now)
            self._warned.pop(key, None)
            return Verdict.ALLOW
        warned_at = self._warned.get(key)
        if warned_at is not None and now - warned_at < self.window:
            return Verdict.DROP
        self._warned[key] = now
        return Verdict.WARN

    def forget_idle(self) -> None:
        """Drop keys with no recent hits so memory stays bounded."""
        now = self._clock()
        for key in [k for k, h in self._hits.items() if not h or now - h[-1] >= self.window]:
            self._hits.pop(key, None)
            self._warned.pop(key, None)


SHARED_TIMEOUT_SECONDS = 1.0
"""How long a message waits for the shared count before it is judged by the
in-process one: a slow database must not hold up replies."""

RETRY_SHARED_SECONDS = 30.0
"""After a fault, how long only the in-process count is used before the database is
asked again (one warning per outage, not one per message)."""


class SharedRateLimiter:
    """The same verdicts as `RateLimiter`, from a count every process shares.

    The count is a window per member, started by their first message and raised by one
    atomic statement per message (`Database.flood_hit`), plus the share of the window
    before that still falls inside the last `window` seconds (`FloodCount.recent`, at
    most `limit` of them: dropped messages never counted in-process either). Up to
    `limit` is allowed, the message that goes over is warned, the rest dropped while
    the count stays over. Every message is also counted by the in-process `local`
    limiter (microseconds), so when the database fails the fallback already knows this
    process's share of the flood.
    """

    def __init__(
        self,
        db: Database,
        local: RateLimiter,
        clock: Callable[[], datetime] = utcnow,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.db = db
        self.local = local
        self.window = timedelta(seconds=local.window)
        self._clock = clock
        self._monotonic = monotonic
        self._local_until = 0.0  # monotonic time before which the database is not asked
        self._pending: set[asyncio.Future[Any]] = set()

    @property
    def limit(self) -> int:
        return self.local.limit

    async def check(self, community_id: str, user_id: str) -> Verdict:
        local = self.local.check(community_id, user_id)
        if self._monotonic() < self._local_until:
            return local
        at = self._clock()
        count = await self._ask(self.db.flood_hit(community_id, user_id, at, self.window))
        if count is None:
            return local
        if count.recent(at, self.window, carried_at_most=self.limit) <= self.limit:
            return Verdict.ALLOW
        warn = await self._ask(self.db.flood_warn(community_id, user_id, at, self.window))
        if warn is None:
            return local
        return Verdict.WARN if warn else Verdict.DROP

    async def _ask(self, request: Awaitable[T]) -> T | None:
        """The database's answer, or None (after falling back) if it fails or is slow."""
        task = asyncio.ensure_future(request)
        try:
            done, _ = await asyncio.wait({task}, timeout=SHARED_TIMEOUT_SECONDS)
        except asyncio.CancelledError:
            self._park(task)
            raise
        if not done:
            self._park(task)
            self._fall_back(f"no answer in {SHARED_TIMEOUT_SECONDS:g} s")
            return None
        try:
            answer = task.result()
        except Exception as exc:
            self._fall_back(str(exc) or type(exc).__name__)
            return None
        if self._local_until:
            self._local_until = 0.0
            log.warning("the shared flood count answers again; using it")
        return answer

    def _fall_back(self, why: str) -> None:
        if not self._local_until:
            log.warning(
                "the shared flood count failed (%s); counting in this process only "
                "(a member may get more messages through across processes) and asking "
                "the database again in %g s",
                why,
                RETRY_SHARED_SECONDS,
            )
        self._local_until = self._monotonic() + RETRY_SHARED_SECONDS

    def _park(self, task: asyncio.Future[Any]) -> None:
        """Let a count nobody waits for any more finish on its own (a statement already
        sent is not cut off); its outcome no longer matters."""
        self._pending.add(task)
        task.add_done_callback(self._forget_task)

    def _forget_task(self, task: asyncio.Future[Any]) -> None:
        self._pending.discard(task)
        if not task.cancelled():
            task.exception()  # retrieved: a late failure was already reported as a timeout

    async def prune(self, now: datetime | None = None) -> int:
        """Delete shared windows that are over (housekeeping: one process at a time)."""
        return await self.db.prune_flood((now or self._clock()) - self.window)
