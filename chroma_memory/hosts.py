"""Where a runtime's communities keep their memories: this process's Chroma directory
(:class:`LocalMemory`), or a Chroma server (:class:`chroma_memory.server.ServerMemory`,
with ``CHROMA_URL``). One of the two per deployment, chosen at start."""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

from chromadb.api.types import Documents, EmbeddingFunction

from chroma_memory.community_store import (
    CommunityEpisodeStore,
    WaitingAwareMemory,
    community_collections,
)
from chroma_memory.shared_chroma import SharedChroma


class MemoryHost(Protocol):
    """Hands out each community's store, and erases a community's memories."""

    def store_for(
        self, community_id: str, embedding_function: EmbeddingFunction[Documents]
    ) -> WaitingAwareMemory: ...

    def reopens(self) -> int: ...

    def drop_community(self, community_id: str) -> int:
        """Delete every memory of a community (erased after the bot was removed)."""
        ...

    def close(self) -> None: ...


class LocalMemory:
    """Chroma in the bot's process, one client for every community (see
    :mod:`chroma_memory.shared_chroma` for why it is reopened past `max_open`)."""

    def __init__(self, persist_dir: Path, *, max_open: int | None) -> None:
        self._chroma = SharedChroma(persist_dir, max_open=max_open)

    def store_for(
        self, community_id: str, embedding_function: EmbeddingFunction[Documents]
    ) -> CommunityEpisodeStore:
        """Blocking (it opens the community's collection): call it off the event loop."""
        return CommunityEpisodeStore.for_community(
            community_id,
            self._chroma.persist_dir,
            client=self._chroma,
            embedding_function=embedding_function,
        )

    def reopens(self) -> int:
        return self._chroma.reopens

    def drop_community(self, community_id: str) -> int:
        return self._chroma.drop(community_collections(community_id))

    def close(self) -> None:
        """The client stays open for the process (Chroma keeps one per directory)."""


__all__ = ["LocalMemory", "MemoryHost"]
