"""Write-behind episode memory: the bot's `AgentMemory` for many communities at once.

Compared with the seed's direct writes (`sonality.memory.access.DirectMemory`):

* a reply's query is embedded on the shared `EmbeddingLane`, so messages of many
  communities that wait together are embedded in one pass, and the reply is marked on
  the shared `ReplyPriority` while it retrieves;
* a committed episode gets its summary's vector before the commit (kept with it in the
  store's episode outbox), once no reply is retrieving;
* committed episodes are written to Chroma in batches by a background task, and until
  then recall ranks them in memory with the stored ones, so batching never hides one.

Why each of these exists, with measurements: docs/performance.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Collection, Sequence

from chroma_memory.embed_lane import EmbeddingLane
from chroma_memory.episodes import WaitingAwareMemory
from chroma_memory.priority import ReplyPriority
from sonality.memory.access import Written, recall_budget
from sonality.memory.episodes import EpisodeMemory, document_of
from sonality.store import Episode, HiddenRange

log = logging.getLogger(__name__)

#: Most episodes per Chroma upsert (an upsert's cost grows quickly past a few dozen).
EPISODE_BATCH = 20
#: The background writer waits for this many episodes or this many seconds.
EPISODE_FLUSH_AT = 8
EPISODE_FLUSH_DELAY = 10.0


class WriteBehindMemory:
    """One community's memories; share `lane` and `priority` across all communities."""

    def __init__(
        self,
        episodes: WaitingAwareMemory,
        *,
        lane: EmbeddingLane | None = None,
        priority: ReplyPriority | None = None,
        label: str = "community",
    ) -> None:
        self._episodes = episodes
        self._own_lane = lane is None
        self.lane = lane or EmbeddingLane(episodes.embed_many)
        self.priority = priority or ReplyPriority()
        self.label = label
        self._written: Written | None = None
        # Committed episodes not yet in Chroma (durable in the store's outbox).
        self.unwritten: list[Episode] = []
        self._write_lock = asyncio.Lock()
        self._wake = asyncio.Event()
        self._writer: asyncio.Task[None] | None = None
        self._closed = False

    @property
    def episodes(self) -> EpisodeMemory:
        return self._episodes

    async def start(self, pending: Sequence[Episode], written: Written) -> None:
        self._written = written
        await self.write(pending)

    async def recall(self, query: str, hidden: Sequence[HiddenRange]) -> list[str]:
        """The memories the message recalls. Its vector is only the query, compared with
        memories embedded from their summaries, and is not kept.

        Memories enrich a reply but are not worth failing it for: if embedding or the
        vector store errs (seen under load: a just-created index not yet readable), the
        reply goes out without memories and the log says why.
        """
        with self.priority.replying():
            unwritten = tuple(self.unwritten)
            try:
                vector = await self.lane.embed(query)
            except Exception:
                log.exception(
                    "%s: could not embed the message; answering without memories", self.label
                )
                return []
            try:
                return await asyncio.to_thread(
                    self._episodes.retrieve_typed,
                    query,
                    *recall_budget(),
                    query_embedding=[vector],
                    unwritten=unwritten,
                    hidden=hidden,
                )
            except Exception:
                log.exception("%s: memory retrieval failed; answering without memories", self.label)
                return []

    async def prepare(self, episodes: list[Episode]) -> list[Episode]:
        """The episodes with the vectors of their documents, embedded in one pass of the
        shared lane once no reply waits. If embedding fails they go without one: the
        store embeds the same text when it writes them, which then happens at once."""
        missing = [i for i, e in enumerate(episodes) if e.embedding is None]
        if not missing:
            return episodes
        await self.priority.wait_quiet()
        try:
            vectors = await asyncio.gather(
                *(self.lane.embed(document_of(episodes[i])) for i in missing)
            )
        except Exception:
            log.warning(
                "%s: could not embed new memories; the store will", self.label, exc_info=True
            )
            return episodes
        ready = list(episodes)
        for i, vector in zip(missing, vectors, strict=True):
            ready[i] = episodes[i].model_copy(update={"embedding": tuple(vector.tolist())})
        return ready

    async def write(self, episodes: Sequence[Episode]) -> None:
        if episodes:
            self.unwritten.extend(episodes)
            self._wake.set()
        if self._writer is None or self._writer.done():
            self._writer = asyncio.create_task(
                self._write_behind(), name=f"sonality-episodes:{self.label}"
            )

    async def _write_behind(self) -> None:
        """Wait for EPISODE_FLUSH_AT episodes or EPISODE_FLUSH_DELAY seconds, whichever
        is first, then write. An episode without a vector (its embedding failed) cannot
        be ranked in memory, so it is written at once."""
        while True:
            await self._wake.wait()
            self._wake.clear()
            deadline = asyncio.get_running_loop().time() + EPISODE_FLUSH_DELAY
            while (
                len(self.unwritten) < EPISODE_FLUSH_AT
                and all(e.embedding is not None for e in self.unwritten)
                and not self._closed
            ):
                left = deadline - asyncio.get_running_loop().time()
                if left <= 0:
                    break
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), left)
                self._wake.clear()
            try:
                await self.flush()
            except asyncio.CancelledError:
                raise
            except Exception:
                # They stay in the store's episode outbox and are retried on next start.
                log.exception("%s: writing memories failed", self.label)

    async def flush(self) -> None:
        """Write waiting episodes in batches, each after no reply is retrieving (bounded):
        a Chroma write blocks every query in the process for several milliseconds."""
        async with self._write_lock:
            while self.unwritten:
                await self.priority.wait_quiet()
                batch = self.unwritten[:EPISODE_BATCH]
                await asyncio.to_thread(self._episodes.store_many, batch)
                if self._written is not None:
                    await self._written([e.id for e in batch])
                del self.unwritten[: len(batch)]

    async def forget(self, ids: Collection[str]) -> None:
        """Drop waiting episodes first, then delete, under the writer's lock so no batch
        in flight lands after the delete."""
        drop = set(ids)
        async with self._write_lock:
            self.unwritten = [e for e in self.unwritten if e.id not in drop]
            if drop:
                await asyncio.to_thread(self._episodes.delete, sorted(drop))

    async def close(self, grace_seconds: float) -> None:
        self._closed = True
        try:
            await asyncio.wait_for(self.flush(), grace_seconds)
        except Exception:
            log.warning("%s: episodes left for the next start", self.label, exc_info=True)
        if self._writer is not None:
            self._writer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._writer
        if self._own_lane:
            self.lane.close()
