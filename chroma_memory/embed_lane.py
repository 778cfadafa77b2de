"""One lane for the embedding model: a single run at a time, batching whoever waits.

Texts that queue while a pass runs go into the next pass together; a lone text runs at
once, so nothing waits for a batch to fill. One pass at a time leaves a core to the
event loop. Measurements: docs/performance.md.
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
        self._waiting: list[tuple[str, asyncio.Future[Vector]]] = []
        self._runner: asyncio.Task[None] | None = None
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="embedding-lane")
        self.passes = 0  # model runs so far; texts ÷ passes is the mean batch size
        self.texts = 0

    async def embed(self, text: str) -> Vector:
        """The text's vector; raises what the embedding function raised."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Vector] = loop.create_future()
        self._waiting.append((text, future))
        if self._runner is None or self._runner.done():
            self._runner = loop.create_task(self._run(), name="embedding-lane")
        return await future

    async def _run(self) -> None:
        batch: list[tuple[str, asyncio.Future[Vector]]] = []
        try:
            while self._waiting:
                batch = [(t, f) for t, f in self._waiting[: self.max_batch] if not f.done()]
                del self._waiting[: self.max_batch]
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
            leftover = [*batch, *self._waiting]
            self._waiting.clear()
            for _, future in leftover:
                future.cancel()

    def close(self) -> None:
        """Let the thread go once its current pass (if any) ends."""
        self._thread.shutdown(wait=False, cancel_futures=True)

    def _vectors(self, texts: list[str]) -> list[Vector]:
        vectors = [np.asarray(v, dtype=np.float32) for v in self._embed_many(texts)]
        if len(vectors) != len(texts):
            raise RuntimeError(f"embedding returned {len(vectors)} vectors for {len(texts)} texts")
        return vectors
