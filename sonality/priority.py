"""Replies before learning: a gate background memory writes wait on.

A Chroma write holds its collection for several milliseconds, and a reply's retrieval
that arrives meanwhile waits for it. Learning is never urgent, replies always are, so
before writing an episode the learning worker waits (briefly, bounded so it can never
starve) until no reply in the process is retrieving memories.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator


class ReplyPriority:
    def __init__(self, max_wait: float = 0.25) -> None:
        self.max_wait = max_wait
        self._active = 0
        self._quiet = asyncio.Event()
        self._quiet.set()

    @contextlib.contextmanager
    def replying(self) -> Iterator[None]:
        """Mark a latency-critical section (a reply's retrieval)."""
        self._active += 1
        self._quiet.clear()
        try:
            yield
        finally:
            self._active -= 1
            if self._active == 0:
                self._quiet.set()

    async def wait_quiet(self) -> None:
        """Return when no reply is retrieving, or after `max_wait` at most."""
        if self._active == 0:
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._quiet.wait(), self.max_wait)


#: One per process: every community's replies outrank every community's learning.
REPLY_PRIORITY = ReplyPriority()
