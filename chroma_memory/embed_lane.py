"""One lane for the embedding model: a single run at a time, batching whoever waits.

Texts that queue while a pass runs go into the next pass together; a lone text runs at
once, so nothing waits for a batch to fill. One pass at a time leaves a core to the
event loop. A reply's text goes into a pass before texts that only learning waits for:
with a hundred communities talking the lane is the busiest part of the process, and a
reply queued behind a pass's worth of summaries waited for it. Learning keeps a share of
every pass, so it is never starved. Measurements: docs/performance.md.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import numpy.typing as npt

log = logging.getLogger(__name__)

Vector = npt.NDArray[np.float32]
EmbedMany = Callable[[list[str]], Sequence[Any]]


class EmbeddingLane:
    """Embed texts one batch at a time on a thread of its own.

    Share one instance between every community of a process: batching across
    communities is where the gain is, and each caller gets back only its own vector.
    The thread is its own so a pass never queues behind Chroma work in the default
    pool. Futures are made on the caller's running loop.
    """

    def __init__(self, embed_many: EmbedMany, max_batch: int = 32) -> None:
        if max_batch < 1:
            raise ValueError("max_batch must be at least 1")
        self._embed_many = embed_many
        self.max_batch = max_batch
        # Replies' texts, then those only background learning waits for.
        self._waiting: list[tuple[str, asyncio.Future[Vector]]] = []
        self._background: list[tuple[str, asyncio.Future[Vector]]] = []
        self._runner: asyncio.Task[None] | None = None
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="embedding-lane")
        self.passes = 0  # model runs so far; texts ÷ passes is the mean batch size
        self.texts = 0

    async def embed(self, text: str, *, background: bool = False) -> Vector:
        """The text's vector; raises what the embedding function raised. A `background`
        text (nobody is waiting for a reply on it) goes after replies' texts, but it
        gets at least a quarter of each pass while any waits."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Vector] = loop.create_future()
        (self._background if background else self._waiting).append((text, future))
        if self._runner is None or self._runner.done():
            self._runner = loop.create_task(self._run(), name="embedding-lane")
        return await future

    async def _run(self) -> None:
        batch: list[tuple[str, asyncio.Future[Vector]]] = []
        try:
            while self._waiting or self._background:
                batch = self._next_batch()
                if not batch:
                    continue
                try:
                    vectors = await asyncio.get_running_loop().run_in_executor(
                        self._thread, self._vectors, [t for t, _ in batch]
                    )
                except Exception as err:
                    log.warning("embedding %d text(s) failed: %s", len(batch), err)
                    for _, future in batch:
                        if not future.done():
                            future.set_exception(err)
                    continue
                self.passes += 1
                self.texts += len(batch)
                for (_, future), vector in zip(batch, vectors, strict=True):
                    if not future.done():
                        future.set_result(vector)
                batch = []
        finally:
            # Only left over when cancelled (the loop is shutting down): nobody may
            # wait forever. Cancelling a finished future does nothing.
            leftover = [*batch, *self._waiting, *self._background]
            self._waiting.clear()
            self._background.clear()
            for _, future in leftover:
                future.cancel()

    def _next_batch(self) -> list[tuple[str, asyncio.Future[Vector]]]:
        """Up to `max_batch` waiting texts, replies' first; background texts keep a
        quarter of the pass (at least one text) while any wait. Cancelled callers'
        texts are dropped."""
        self._waiting = [(t, f) for t, f in self._waiting if not f.done()]
        self._background = [(t, f) for t, f in self._background if not f.done()]
        share = min(len(self._background), max(1, self.max_batch // 4))
        replies = min(len(self._waiting), self.max_batch - share)
        learning = min(len(self._background), self.max_batch - replies)
        batch = [*self._waiting[:replies], *self._background[:learning]]
        del self._waiting[:replies]
        del self._background[:learning]
        return batch

    def close(self) -> None:
        """Let the thread go once its current pass (if any) ends."""
        self._thread.shutdown(wait=False, cancel_futures=True)

    def _vectors(self, texts: list[str]) -> list[Vector]:
        vectors = [np.asarray(v, dtype=np.float32) for v in self._embed_many(texts)]
        if len(vectors) != len(texts):
            raise RuntimeError(f"embedding returned {len(vectors)} vectors for {len(texts)} texts")
        return vectors
