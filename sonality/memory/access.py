"""How the agent reaches its memories from the event loop.

`EpisodeMemory` is synchronous, as the seed's Chroma store is. The agent needs a little
more around it: recall that never fails a reply, episodes written only after their
version is committed (the store keeps them in its episode outbox until `written` is
called), and a way to wait for those writes. `AgentMemory` is that contract.

`DirectMemory` here is the seed's behaviour: each commit's episodes are stored at once.
A host with many communities can hand the agent a faster `AgentMemory` instead (the bot
uses `chroma_memory.write_behind`), and the agent does not change.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Collection, Sequence
from typing import Protocol, runtime_checkable

from sonality import config
from sonality.memory.episodes import EpisodeMemory
from sonality.store import Episode, HiddenRange

log = logging.getLogger(__name__)

#: Called with the ids of episodes once they are in the episode memory.
Written = Callable[[list[str]], Awaitable[None]]


def recall_budget() -> tuple[int, int, float]:
    """Episodic and semantic memories per reply, and the relevance floor (configured)."""
    return (
        config.EPISODIC_RETRIEVAL_COUNT,
        config.SEMANTIC_RETRIEVAL_COUNT,
        config.MIN_EPISODE_RELEVANCE,
    )


@runtime_checkable
class AgentMemory(Protocol):
    """One community's episode memory as the agent uses it on its event loop."""

    @property
    def episodes(self) -> EpisodeMemory:
        """The store underneath, for commands and tests that read it directly."""
        ...

    async def start(self, pending: Sequence[Episode], written: Written) -> None:
        """Begin with the episodes committed but not yet written (after a crash)."""
        ...

    async def recall(self, query: str, hidden: Sequence[HiddenRange]) -> list[str]:
        """Memories for a reply; an empty list (and a logged reason) when memory fails."""
        ...

    async def prepare(self, episodes: list[Episode]) -> list[Episode]:
        """The episodes as they should be committed (a host may attach vectors)."""
        ...

    async def write(self, episodes: Sequence[Episode]) -> None:
        """Store committed episodes, now or later; `written` is called once they are."""
        ...

    async def flush(self) -> None:
        """Return once every episode handed to `write` is stored."""
        ...

    async def forget(self, ids: Collection[str]) -> None:
        """Delete memories by id, including any still waiting to be written."""
        ...

    async def close(self, grace_seconds: float) -> None: ...


class DirectMemory:
    """The seed's way: episodes are stored right after their commit, on a worker thread.

    A write that fails leaves the episodes in the store's outbox; the next start writes
    them (`start`).
    """

    def __init__(self, episodes: EpisodeMemory, label: str = "community") -> None:
        self._episodes = episodes
        self.label = label
        self._written: Written | None = None

    @property
    def episodes(self) -> EpisodeMemory:
        return self._episodes

    async def start(self, pending: Sequence[Episode], written: Written) -> None:
        self._written = written
        await self.write(pending)

    async def recall(self, query: str, hidden: Sequence[HiddenRange]) -> list[str]:
        try:
            return await asyncio.to_thread(
                self._episodes.retrieve_typed, query, *recall_budget(), hidden=hidden
            )
        except Exception:
            log.exception("%s: memory retrieval failed; answering without memories", self.label)
            return []

    async def prepare(self, episodes: list[Episode]) -> list[Episode]:
        return episodes

    async def write(self, episodes: Sequence[Episode]) -> None:
        if not episodes:
            return
        try:
            await asyncio.to_thread(self._episodes.store_many, list(episodes))
            if self._written is not None:
                await self._written([e.id for e in episodes])
        except Exception:
            log.exception("%s: writing memories failed; retried on next start", self.label)

    async def flush(self) -> None:
        return None

    async def forget(self, ids: Collection[str]) -> None:
        if ids:
            await asyncio.to_thread(self._episodes.delete, sorted(ids))

    async def close(self, grace_seconds: float) -> None:
        return None
