"""Replies before learning: a gate background memory writes wait on.

Before writing a batch of episodes the learning worker waits, for at most `max_wait`
so it can never starve, until no reply in the process is retrieving memories; a write
that ran meanwhile would hold the collection the reply reads. See docs/performance.md.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator


class ReplyPriority:
    """Share one instance between all agents of a runtime (one event loop)."""

    def __init__(self, max_wait: float = 0.25) -> None:
        self.max_wait = max_wait
        self._active = 0
        self._waiters: set[asyncio.Future[None]] = set()

    @contextlib.contextmanager
    def replying(self) -> Iterator[None]:
        """Mark a latency-critical section (a reply's retrieval)."""
        self._active += 1
        try:
            yield
        finally:
            self._active -= 1
            if self._active == 0:
                for waiter in self._waiters:
                    if not waiter.done():
                        waiter.set_result(None)
                self._waiters.clear()

    async def wait_quiet(self) -> None:
        """Return when no reply is retrieving, or after `max_wait` at most.

        Futures are made per call on the running loop, so an instance is not tied to
        the event loop it was created in.
        """
        if self._active == 0:
            return
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.add(waiter)
        try:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(waiter, self.max_wait)
        finally:
            self._waiters.discard(waiter)
