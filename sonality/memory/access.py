"""The agent's memories on the event loop: recall that never fails a reply, episodes
written after their commit (kept in the store's outbox until `written`), and a wait for
those writes. `DirectMemory` writes at once, as the seed does; a host may bring a faster
`AgentMemory` (the bot's is in `chroma_memory.write_behind`)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Collection, Sequence
from typing import Protocol, runtime_checkable

from sonality.config import MIN_EPISODE_RELEVANCE, EngineConfig, or_environment
from sonality.memory.episodes import EpisodeMemory
from sonality.store import Episode, HiddenRange

log = logging.getLogger(__name__)

Written = Callable[[list[str]], Awaitable[None]]


def recall_budget(config: EngineConfig | None = None) -> tuple[int, int, float]:
    """Episodic and semantic memories per reply under `config` (the environment's when
    none is given), and the relevance floor."""
    config = or_environment(config)
    return (
        config.episodic_retrieval_count,
        config.semantic_retrieval_count,
        MIN_EPISODE_RELEVANCE,
    )


@runtime_checkable
class AgentMemory(Protocol):
    @property
    def episodes(self) -> EpisodeMemory:
        """The store underneath."""

    async def start(self, pending: Sequence[Episode], written: Written) -> None:
        """Begin with the episodes a crash left unwritten."""

    async def recall(self, query: str, hidden: Sequence[HiddenRange]) -> list[str]:
        """Memories for a reply; none (logged) when memory fails."""

    async def prepare(self, episodes: list[Episode]) -> list[Episode]:
        """The episodes as they should be committed (perhaps with vectors)."""

    async def write(self, episodes: Sequence[Episode]) -> None:
        """Store committed episodes, now or later, then call `written`."""

    async def flush(self) -> None:
        """Return once every episode handed to `write` is stored."""

    async def forget(self, ids: Collection[str]) -> None:
        """Delete memories by id, including any still waiting to be written."""

    async def close(self, grace_seconds: float) -> None: ...


class DirectMemory:
    """Episodes stored right after their commit; a failed write is retried at start.
    Recall asks for `config`'s budget (the environment's when none is given)."""

    def __init__(
        self,
        episodes: EpisodeMemory,
        label: str = "community",
        *,
        config: EngineConfig | None = None,
    ) -> None:
        self.episodes = episodes
        self.label = label
        self.config = or_environment(config)
        self._written: Written | None = None

    async def start(self, pending: Sequence[Episode], written: Written) -> None:
        self._written = written
        await self.write(pending)

    async def recall(self, query: str, hidden: Sequence[HiddenRange]) -> list[str]:
        try:
            return await asyncio.to_thread(
                self.episodes.retrieve_typed, query, *recall_budget(self.config), hidden=hidden
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
            await asyncio.to_thread(self.episodes.store_many, list(episodes))
            if self._written is not None:
                await self._written([e.id for e in episodes])
        except Exception:
            log.exception("%s: writing memories failed; retried on next start", self.label)

    async def flush(self) -> None:
        return None

    async def forget(self, ids: Collection[str]) -> None:
        if ids:
            await asyncio.to_thread(self.episodes.delete, sorted(ids))

    async def close(self, grace_seconds: float) -> None:
        return None
