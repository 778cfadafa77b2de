"""Write-behind episode memory: the bot's `AgentMemory` for many communities at once.

Compared with the seed's direct writes (`sonality.memory.access.DirectMemory`):

* a reply's query is embedded on the shared `EmbeddingLane`, so messages of many
  communities that wait together are embedded in one pass, and the reply is marked on
  the shared `ReplyPriority` while it retrieves;
* a committed episode gets its summary's vector before the commit (kept with it in the
  store's episode outbox), once no reply is retrieving;
* committed episodes are written to Chroma in batches by a background task, and until
  then recall ranks them in memory with the stored ones, so batching never hides one;
* with several processes sharing the store, a batch is written only under the
  community's episode lock and without the episodes no longer to be written, so a
  forget-me handled by another process is never undone by a batch held here
  (`WriteGuard`, implemented by `storage.community.EpisodeGuard`), and recall ranks
  only the waiting episodes still to be written, so such a forget-me is not undone by
  a reply here either;
* the queue holds each episode once (by id, the last handed in wins): processes that
  share the store adopt each other's waiting episodes (`SonalityAgent.catch_up`), and
  Chroma refuses a whole batch that names an id twice;
* a batch Chroma refuses for good (bad input, never a connection or server fault) is
  written again one episode at a time, and an episode refused alone leaves the queue
  (it stays in the store's outbox, for the next start), so one bad episode never
  blocks every later write.

Why each of these exists, with measurements: docs/performance.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Collection, Sequence
from typing import Protocol

from chromadb.errors import ChromaError

from chroma_memory.community_store import WaitingAwareMemory
from chroma_memory.embed_lane import EmbeddingLane
from chroma_memory.priority import ReplyPriority
from sonality.config import EngineConfig, or_environment
from sonality.memory.access import Written, recall_budget
from sonality.memory.episodes import EpisodeMemory, document_of
from sonality.store import Episode, HiddenRange

log = logging.getLogger(__name__)

#: Most episodes per Chroma upsert (an upsert's cost grows quickly past a few dozen).
EPISODE_BATCH = 20
#: The background writer waits for this many episodes or this many seconds.
EPISODE_FLUSH_AT = 8
EPISODE_FLUSH_DELAY = 10.0
#: How often a write or a forget asks again for the episode lock another process holds
#: (it holds it for one batch or one delete), and how long it asks before giving up.
GUARD_POLL_SECONDS = 0.05
GUARD_WAIT_SECONDS = 60.0


#: Chroma errors that come and go: a collection gone and reopened (404), timeouts and
#: rate limits; any other 4xx is the request's own fault.
PASSING_CODES = frozenset({404, 408, 429})


def refused(exc: BaseException) -> bool:
    """Whether the memory store refused the request itself (a duplicate id, a vector of
    the wrong size, ...), so that sending it again can never work; anything else (the
    server unreachable or failing, the episode lock never coming) may pass later."""
    if isinstance(exc, ChromaError):
        return 400 <= exc.code() < 500 and exc.code() not in PASSING_CODES
    return isinstance(exc, (ValueError, TypeError))


def kept_as(episode: Episode) -> tuple[object, ...]:
    """What a memory store keeps of `episode` (`sonality.memory.episodes.upsert`): the
    outbox leaves out the rest, so an adopted copy of a queued episode differs from it
    only there."""
    e = episode
    return (document_of(e), e.ess_score, e.memory_type, e.interaction, e.version, e.embedding)


class WriteGuard(Protocol):
    """A community's episode lock across processes, and the check a batch passes."""

    async def acquire(self) -> bool:
        """Take the lock if no other process holds it; never waits."""
        ...

    async def release(self) -> None: ...

    async def still_to_write(self, episode_ids: Sequence[str]) -> set[str]:
        """Those of the ids that may still be written (their member not forgotten,
        not written by another process meanwhile)."""
        ...

    async def discard(self, episode_ids: Sequence[str]) -> None:
        """No process is to write these any more (a forget-me deletes them)."""
        ...


class WriteBehindMemory:
    """One community's memories; share `lane` and `priority` across all communities."""

    def __init__(
        self,
        episodes: WaitingAwareMemory,
        *,
        lane: EmbeddingLane | None = None,
        priority: ReplyPriority | None = None,
        label: str = "community",
        guard: WriteGuard | None = None,
        flush_delay: float = EPISODE_FLUSH_DELAY,
        config: EngineConfig | None = None,
    ) -> None:
        """`guard`: only when other processes write the same community's episodes;
        without it (one process) nothing is checked or locked. `flush_delay`: the
        longest a committed episode waits before its batch is written. `config`: the
        agent's, whose recall budget this memory applies (the environment's if none)."""
        self.config = or_environment(config)
        self._episodes = episodes
        self._guard = guard
        self.flush_delay = flush_delay
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
            try:
                vector, unwritten = await asyncio.gather(
                    self.lane.embed(query), self._still_waiting(tuple(self.unwritten))
                )
            except Exception:
                log.exception(
                    "%s: could not embed the message; answering without memories", self.label
                )
                return []
            try:
                return await asyncio.to_thread(
                    self._episodes.retrieve_typed,
                    query,
                    *recall_budget(self.config),
                    query_embedding=[vector],
                    unwritten=unwritten,
                    hidden=hidden,
                )
            except Exception:
                log.exception("%s: memory retrieval failed; answering without memories", self.label)
                return []

    async def _still_waiting(self, waiting: tuple[Episode, ...]) -> tuple[Episode, ...]:
        """Those of `waiting` still to be written, which recall may rank in memory.

        Why: with other processes, a forget-me handled by one of them removes its
        member's episodes from the store's outbox but cannot reach this queue, which
        would otherwise recall them here until its next batch (up to `flush_delay`).
        One query, made while the message is embedded. Episodes no longer to be written
        (forgotten, or written by another process) leave the queue too. If the store
        cannot answer, this reply recalls only stored memories (the log says why).
        """
        if self._guard is None or not waiting:
            return waiting
        try:
            keep = await self._guard.still_to_write([e.id for e in waiting])
        except Exception:
            log.warning(
                "%s: could not check the memories waiting to be written; recalling "
                "stored ones only",
                self.label,
                exc_info=True,
            )
            return ()
        self._take_out([e for e in waiting if e.id not in keep])
        return tuple(e for e in waiting if e.id in keep)

    def _take_out(self, episodes: Collection[Episode]) -> None:
        """Remove these very entries from the queue (not others with their ids: a newer
        episode handed in meanwhile under the same id is still to be written)."""
        gone = {id(e) for e in episodes}
        if gone:
            self.unwritten[:] = [e for e in self.unwritten if id(e) not in gone]

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
                *(self.lane.embed(document_of(episodes[i]), background=True) for i in missing)
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
        """Queue `episodes`, each id once: one already queued as the store would keep it
        stays where it is (the waiting episodes in the shared outbox are adopted again
        and again, see `SonalityAgent.catch_up`, this process's own among them); one
        queued with other content is replaced, the last handed in winning."""
        fresh = {e.id: e for e in episodes}
        for queued in self.unwritten:
            again = fresh.get(queued.id)
            if again is not None and kept_as(again) == kept_as(queued):
                del fresh[queued.id]
        if fresh:
            self.unwritten[:] = [e for e in self.unwritten if e.id not in fresh]
            self.unwritten.extend(fresh.values())
            self._wake.set()
        if self._writer is None or self._writer.done():
            self._writer = asyncio.create_task(
                self._write_behind(), name=f"sonality-episodes:{self.label}"
            )

    async def _write_behind(self) -> None:
        """Wait for EPISODE_FLUSH_AT episodes or `flush_delay` seconds, whichever is
        first, then write. An episode without a vector (its embedding failed) cannot
        be ranked in memory, so it is written at once."""
        while True:
            await self._wake.wait()
            self._wake.clear()
            deadline = asyncio.get_running_loop().time() + self.flush_delay
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
                taken = self.unwritten[:EPISODE_BATCH]
                batch = list({e.id: e for e in taken}.values())  # each id once, last wins
                try:
                    done = await self._store(batch)
                except Exception as exc:
                    if not refused(exc):
                        raise  # the batch stays queued (and in the outbox) for next time
                    done = await self._store_each(batch, exc)
                if self._written is not None and done:
                    await self._written([e.id for e in done])
                self._take_out(taken)

    async def _store(self, batch: list[Episode]) -> list[Episode]:
        """Store `batch` (with other processes, those of it still to be written);
        returns the episodes stored."""
        if self._guard is None:
            await asyncio.to_thread(self._episodes.store_many, batch)
            return batch
        return await self._store_checked(self._guard, batch)

    async def _store_each(self, batch: list[Episode], exc: Exception) -> list[Episode]:
        """After the store refused `batch` for good (`refused`): its episodes one by one,
        so only an episode refused alone is lost to this queue. That one stays in the
        store's outbox (written again at the next start), and the log names it and why.
        Returns the episodes stored."""
        log.warning(
            "%s: the memory store refused a batch of %d episode(s) (%s: %s); "
            "writing them one at a time",
            self.label,
            len(batch),
            type(exc).__name__,
            exc,
        )
        done: list[Episode] = []
        for episode in batch:
            try:
                done += await self._store([episode])
            except Exception as alone:
                if not refused(alone):
                    raise
                log.error(
                    "%s: the memory store refused episode %s (%s: %s); it stays in the "
                    "outbox, to be tried again at the next start",
                    self.label,
                    episode.id,
                    type(alone).__name__,
                    alone,
                )
        return done

    async def _store_checked(self, guard: WriteGuard, batch: list[Episode]) -> list[Episode]:
        """Store those of `batch` still to be written, checked and written under the
        episode lock (see `WriteGuard`); returns them."""
        async with self._locked(guard):
            keep = await guard.still_to_write([e.id for e in batch])
            ready = [e for e in batch if e.id in keep]
            if ready:
                await asyncio.to_thread(self._episodes.store_many, ready)
        if len(ready) < len(batch):
            log.info(
                "%s: %d episode(s) not written: forgotten, or written by another process",
                self.label,
                len(batch) - len(ready),
            )
        return ready

    @contextlib.asynccontextmanager
    async def _locked(self, guard: WriteGuard) -> AsyncIterator[None]:
        """The episode lock, waited for: another process holds it for one batch or one
        delete. Raises if it never comes (the coordination connection is down): the
        episodes then stay queued, and in the store's outbox."""
        waited = 0.0
        while not await guard.acquire():
            if waited >= GUARD_WAIT_SECONDS:
                raise RuntimeError(f"{self.label}: the episode lock never came ({waited:.0f}s)")
            await asyncio.sleep(GUARD_POLL_SECONDS)
            waited += GUARD_POLL_SECONDS
        try:
            yield
        finally:
            await guard.release()

    async def forget(self, ids: Collection[str]) -> None:
        """Drop waiting episodes first, then delete, under the writer's lock so no batch
        in flight lands after the delete. With other processes, under the episode lock
        too, and with the episodes discarded from the store's outbox first, so no batch
        of theirs lands after it either (see `WriteGuard`)."""
        drop = set(ids)
        async with self._write_lock:
            self.unwritten[:] = [e for e in self.unwritten if e.id not in drop]
            if not drop:
                return
            if self._guard is None:
                await asyncio.to_thread(self._episodes.delete, sorted(drop))
                return
            async with self._locked(self._guard):
                await self._guard.discard(sorted(drop))
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
