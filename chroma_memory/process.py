"""Chroma in a process of its own, reached through `multiprocessing`'s managers.

Why (chromadb 1.5.9, measured with 100 communities chatting on 2 cores):

* Chroma's Rust bindings release the GIL for reads but hold it for writes: an upsert of
  8 episodes keeps it about 13 ms, mostly waiting on Chroma's own threads. Closing the
  client to bound memory (see :mod:`chroma_memory.shared_chroma`) holds it ~60 ms.
  In the bot's process each of those stalls the event loop, which sends and reads every
  LLM call, so LLM slots stayed occupied after their answers had arrived: with writes
  switched off, throughput rose from 101 to 124 calls/s.
* In a process of its own, those stalls only delay other memory calls.

The embedding model stays in the bot's process (its passes release the GIL, and the
embedding lane batches them); every vector is computed there and sent along, so the
memory process never loads the model. Calls are synchronous, like
:class:`~chroma_memory.episodes.EpisodeStore`'s, and run on the caller's thread
(`asyncio.to_thread`); each thread gets its own connection, so calls run concurrently.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import os
import signal
import threading
from collections.abc import Callable, Sequence
from multiprocessing.managers import BaseManager
from pathlib import Path
from typing import Any, Protocol, TypeVar, cast

from chromadb.api.types import Documents, EmbeddingFunction, Embeddings

from chroma_memory.embedding import default_embedding_function
from chroma_memory.episodes import EpisodeStore, WaitingAwareMemory, collection_name_for
from chroma_memory.shared_chroma import SharedChroma
from sonality.memory.episodes import (
    EPISODIC_N,
    MIN_RELEVANCE,
    N_RESULTS,
    RECENT_N,
    SEMANTIC_N,
    with_vectors,
)
from sonality.store import Episode, HiddenRange

log = logging.getLogger(__name__)
T = TypeVar("T")


def community_collections(community_id: str) -> list[str]:
    """Both of a community's collections: episodes, and consolidated insights."""
    name = collection_name_for(community_id)
    return [name, f"{name}-semantic"]


class MemoryService:
    """Lives in the memory process: one shared client, one store per community."""

    def __init__(self, persist_dir: str, max_open: int | None, model_cache_dir: str) -> None:
        self._chroma = SharedChroma(Path(persist_dir), max_open=max_open)
        # Collections record which function made their vectors, so it must be the same
        # one; it loads its model only if asked to embed, which this process never is.
        self._embed = default_embedding_function(Path(model_cache_dir))
        self._stores: dict[str, EpisodeStore] = {}
        self._lock = threading.Lock()

    def _store(self, community_id: str) -> EpisodeStore:
        with self._lock:
            store = self._stores.get(community_id)
        if store is None:
            store = EpisodeStore.for_community(
                community_id,
                self._chroma.persist_dir,
                client=self._chroma,
                embedding_function=self._embed,
            )
            with self._lock:
                store = self._stores.setdefault(community_id, store)
        return store

    def open_store(self, community_id: str) -> None:
        self._store(community_id)

    def store_many(self, community_id: str, episodes: Sequence[Episode]) -> None:
        self._store(community_id).store_many(episodes)

    def delete(self, community_id: str, ids: Sequence[str]) -> None:
        self._store(community_id).delete(ids)

    def semantic_ids(self, community_id: str, documents: Sequence[str]) -> list[str]:
        return self._store(community_id).semantic_ids(documents)

    def retrieve_typed(
        self,
        community_id: str,
        query: str,
        episodic_n: int,
        semantic_n: int,
        min_relevance: float,
        query_embedding: Embeddings,
        unwritten: Sequence[Episode],
        hidden: Sequence[HiddenRange] = (),
    ) -> list[str]:
        return self._store(community_id).retrieve_typed(
            query,
            episodic_n,
            semantic_n,
            min_relevance,
            query_embedding=query_embedding,
            unwritten=unwritten,
            hidden=hidden,
        )

    def retrieve(
        self,
        community_id: str,
        query: str,
        n_results: int,
        min_relevance: float,
        where: dict[str, Any] | None,
        query_embedding: Embeddings,
    ) -> list[str]:
        return self._store(community_id).retrieve(
            query, n_results, min_relevance, where, query_embedding=query_embedding
        )

    def recent_summaries(
        self,
        community_id: str,
        since_interaction: int,
        limit: int,
        hidden: Sequence[HiddenRange] = (),
    ) -> list[str]:
        return self._store(community_id).recent_summaries(since_interaction, limit, hidden)

    def count(self, community_id: str) -> int:
        return self._store(community_id).count()

    def drop_community(self, community_id: str) -> int:
        with self._lock:
            self._stores.pop(community_id, None)
        return self._chroma.drop(community_collections(community_id))

    def reopens(self) -> int:
        return self._chroma.reopens

    def pid(self) -> int:
        return os.getpid()


class _Manager(BaseManager):
    pass


_Manager.register("MemoryService", MemoryService)


def _child_setup() -> None:
    """In the memory process: leave shutdown to the bot, and never outlive it.

    Ctrl-C and SIGTERM reach the whole process group; the bot still has episodes to
    write when it gets them, so this process ignores them and the bot stops it last.
    If the bot dies without stopping it (kill -9), it exits too, so no orphan keeps
    the Chroma directory open when the bot restarts.
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    parent = multiprocessing.parent_process()
    if parent is not None:

        def exit_with_parent() -> None:
            parent.join()
            os._exit(0)

        threading.Thread(target=exit_with_parent, name="parent-watch", daemon=True).start()


class MemoryHost(Protocol):
    """Where a runtime's communities keep their memories."""

    def store_for(
        self, community_id: str, embedding_function: EmbeddingFunction[Documents]
    ) -> WaitingAwareMemory: ...

    def reopens(self) -> int: ...

    def drop_community(self, community_id: str) -> int:
        """Delete every memory of a community (erased after the bot was removed)."""
        ...

    def close(self) -> None: ...


class LocalMemory:
    """Chroma in this process (``SONALITY_MEMORY_PROCESS=false``): no second process to
    start, at the price of the event-loop stalls described above."""

    def __init__(self, persist_dir: Path, *, max_open: int | None) -> None:
        self._chroma = SharedChroma(persist_dir, max_open=max_open)

    def store_for(
        self, community_id: str, embedding_function: EmbeddingFunction[Documents]
    ) -> EpisodeStore:
        """Blocking (it opens the community's collection): call it off the event loop."""
        return EpisodeStore.for_community(
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


class MemoryProcess:
    """Start the memory process, hand out per-community stores, restart it if it dies,
    stop it."""

    def __init__(self, persist_dir: Path, *, max_open: int | None, model_cache_dir: Path) -> None:
        """Blocks while the process starts: 1.7 s the first time (the fork server imports
        Chroma), about 0.25 s after that."""
        self._args = (str(persist_dir), max_open, str(model_cache_dir))
        self._lock = threading.Lock()
        self.restarts = 0
        self._manager, self._service = self._start()

    def _start(self) -> tuple[_Manager, MemoryService]:
        manager = _Manager(ctx=_context())
        manager.start(initializer=_child_setup)
        # A proxy with the service's methods, each run in the memory process.
        service = cast(MemoryService, manager.MemoryService(*self._args))  # type: ignore[attr-defined]
        self.pid = service.pid()
        log.info("memory process %d serves %s", self.pid, self._args[0])
        return manager, service

    def call(self, operation: Callable[[MemoryService], T]) -> T:
        """Run `operation` on the service; if the process has died, start a new one and
        retry once.

        Memories are durable on disk and episodes not yet written stay in the bot's
        outbox, so a new process picks up where the old one stopped.
        """
        service = self._service
        try:
            return operation(service)
        except _GONE as err:
            with self._lock:
                if self._service is service:  # no other thread restarted it meanwhile
                    log.error("memory process %d is gone (%r); starting a new one", self.pid, err)
                    with contextlib.suppress(Exception):
                        self._manager.shutdown()
                    self._manager, self._service = self._start()
                    self.restarts += 1
            return operation(self._service)

    def store_for(
        self, community_id: str, embedding_function: EmbeddingFunction[Documents]
    ) -> RemoteEpisodeStore:
        """Blocking (it opens the community's collection): call it off the event loop."""
        self.call(lambda service: service.open_store(community_id))
        return RemoteEpisodeStore(self, community_id, embedding_function)

    def reopens(self) -> int:
        return self.call(lambda service: service.reopens())

    def drop_community(self, community_id: str) -> int:
        return self.call(lambda service: service.drop_community(community_id))

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self._manager.shutdown()


def _context() -> multiprocessing.context.BaseContext:
    """A fork server that has imported Chroma once starts each memory process in about
    0.25 s instead of 1.7 s; plain spawn where there is none (Windows). Never plain
    fork: the bot has threads by then."""
    if "forkserver" in multiprocessing.get_all_start_methods():
        context = multiprocessing.get_context("forkserver")
        context.set_forkserver_preload([__name__])
        return context
    return multiprocessing.get_context("spawn")


# What a call raises when the memory process has died under it.
_GONE = (EOFError, ConnectionError)


class RemoteEpisodeStore:
    """One community's memories, kept by the memory process; the same calls as
    :class:`~chroma_memory.episodes.EpisodeStore` that the agent makes."""

    def __init__(
        self,
        host: MemoryProcess,
        community_id: str,
        embedding_function: EmbeddingFunction[Documents],
    ) -> None:
        self._host = host
        self._community_id = community_id
        self._embed = embedding_function

    def embed_many(self, texts: Sequence[str]) -> Embeddings:
        return self._embed(list(texts))

    def store_many(self, episodes: Sequence[Episode]) -> None:
        """Missing vectors are computed here, so the memory process never embeds."""
        ready = with_vectors(episodes, self._embed)
        self._host.call(lambda service: service.store_many(self._community_id, ready))

    def delete(self, ids: Sequence[str]) -> None:
        wanted = list(ids)
        self._host.call(lambda service: service.delete(self._community_id, wanted))

    def semantic_ids(self, documents: Sequence[str]) -> list[str]:
        texts = list(documents)
        found: list[str] = self._host.call(
            lambda service: service.semantic_ids(self._community_id, texts)
        )
        return found

    def retrieve_typed(
        self,
        query: str,
        episodic_n: int = EPISODIC_N,
        semantic_n: int = SEMANTIC_N,
        min_relevance: float = MIN_RELEVANCE,
        *,
        query_embedding: Embeddings | None = None,
        unwritten: Sequence[Episode] = (),
        hidden: Sequence[HiddenRange] = (),
    ) -> list[str]:
        vector = query_embedding if query_embedding is not None else self._embed([query])
        waiting = list(unwritten)
        ranges = list(hidden)
        return self._host.call(
            lambda service: service.retrieve_typed(
                self._community_id,
                query,
                episodic_n,
                semantic_n,
                min_relevance,
                vector,
                waiting,
                ranges,
            )
        )

    def retrieve(
        self,
        query: str,
        n_results: int = N_RESULTS,
        min_relevance: float = MIN_RELEVANCE,
        where: dict[str, Any] | None = None,
        *,
        query_embedding: Embeddings | None = None,
    ) -> list[str]:
        vector = query_embedding if query_embedding is not None else self._embed([query])
        return self._host.call(
            lambda service: service.retrieve(
                self._community_id, query, n_results, min_relevance, where, vector
            )
        )

    def recent_summaries(
        self, since_interaction: int, limit: int = RECENT_N, hidden: Sequence[HiddenRange] = ()
    ) -> list[str]:
        ranges = list(hidden)
        return self._host.call(
            lambda service: service.recent_summaries(
                self._community_id, since_interaction, limit, ranges
            )
        )

    def count(self) -> int:
        return self._host.call(lambda service: service.count(self._community_id))


__all__ = ["LocalMemory", "MemoryHost", "MemoryProcess", "MemoryService", "RemoteEpisodeStore"]
