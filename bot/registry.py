"""Loads a community's agent on first use and evicts the idle ones.

A process may know thousands of communities while only a few talk at once; keeping
every agent resident would cost memory for nothing. Loading is guarded per community
so two simultaneous first messages never build two agents for one community.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from bot.messages import Community
from sonality.agent import SonalityAgent

log = logging.getLogger(__name__)

AgentFactory = Callable[[Community], Awaitable[SonalityAgent]]


@dataclass
class _Entry:
    agent: SonalityAgent
    last_used: float


class CommunityRegistry:
    def __init__(
        self,
        factory: AgentFactory,
        idle_seconds: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.factory = factory
        self._idle_seconds = idle_seconds
        self._clock = clock
        self._entries: dict[str, _Entry] = {}
        self._loading: dict[str, asyncio.Lock] = {}

    async def agent_by_id(self, community_id: str) -> SonalityAgent:
        """`agent_for` when only the id is known (work resumed or a platform event that
        names no community)."""
        return await self.agent_for(Community(id=community_id))

    async def agent_for(self, community: Community) -> SonalityAgent:
        entry = self._entries.get(community.id)
        if entry is None:
            lock = self._loading.setdefault(community.id, asyncio.Lock())
            async with lock:
                entry = self._entries.get(community.id)
                if entry is None:
                    agent = await self.factory(community)
                    entry = _Entry(agent=agent, last_used=self._clock())
                    self._entries[community.id] = entry
            self._loading.pop(community.id, None)
        entry.last_used = self._clock()
        return entry.agent

    def loaded(self) -> dict[str, SonalityAgent]:
        return {cid: e.agent for cid, e in self._entries.items()}

    def get(self, community_id: str) -> SonalityAgent | None:
        entry = self._entries.get(community_id)
        return entry.agent if entry else None

    async def evict_idle(self) -> list[str]:
        """Close agents idle longer than the limit with nothing left to post-process."""
        now = self._clock()
        evicted = []
        for cid, entry in list(self._entries.items()):
            if now - entry.last_used < self._idle_seconds or entry.agent.backlog:
                continue
            if (
                entry.agent.sponge.pending_insights
                and now - entry.last_used < 2 * self._idle_seconds
            ):
                continue  # give idle-time reflection a chance first
            await self._close(cid, entry)
            evicted.append(cid)
        if evicted:
            log.info("evicted %d idle community agent(s)", len(evicted))
        return evicted

    async def drain(self, community_id: str | None = None) -> None:
        if community_id is None:
            entries = list(self._entries.values())
        else:
            entry = self._entries.get(community_id)
            entries = [entry] if entry is not None else []
        await asyncio.gather(*(e.agent.drain() for e in entries))

    async def unload(self, community_id: str) -> bool:
        """Close one community's agent now (the bot was removed from it); its queued
        learning finishes first. True if one was loaded."""
        lock = self._loading.get(community_id)
        if lock is not None:
            async with lock:  # a load in progress finishes, then is closed here
                pass
        entry = self._entries.get(community_id)
        if entry is None:
            return False
        await self._close(community_id, entry)
        return True

    async def _close(self, community_id: str, entry: _Entry) -> None:
        """Take the agent out and close it under the community's load lock, so a message
        arriving meanwhile loads a new agent only after the old one's last commit (a
        close finishes queued learning); loaded earlier, it would answer from the state
        before that commit and, on SQLite, write its next version over it."""
        lock = self._loading.setdefault(community_id, asyncio.Lock())
        async with lock:
            if self._entries.get(community_id) is entry:
                del self._entries[community_id]
            await entry.agent.close()
        if self._loading.get(community_id) is lock and not lock.locked():
            del self._loading[community_id]

    async def close_all(self) -> None:
        entries = list(self._entries.values())
        self._entries.clear()
        await asyncio.gather(*(e.agent.close() for e in entries))
