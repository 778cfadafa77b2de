"""Per-user flood control that costs no LLM calls.

A user who sends more than `limit` messages inside `window` seconds gets one short
"slow down" notice; further messages in the same flood are dropped silently, so a
spammer can't make the bot spam back.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from enum import Enum


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
