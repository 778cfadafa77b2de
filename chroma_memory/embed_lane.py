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
import contextlib
import logging
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, cast

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
    pool. It takes the next batch itself as soon as a pass ends, instead of waiting for
    the event loop to hand it one: with a hundred communities talking the loop is busy,
    and the lane sat idle with texts waiting for about 15% of the time. Each caller's
    future is settled on its own loop.
    """

    def __init__(self, embed_many: EmbedMany, max_batch: int = 32) -> None:
        if max_batch < 1:
            raise ValueError("max_batch must be at least 1")
        self._embed_many = embed_many
        self.max_batch = max_batch
        # Shared with the lane's thread, under the lock: replies' texts, then those only
        # background learning waits for; whether the thread is draining them.
        self._lock = threading.Lock()
        self._waiting: list[tuple[str, asyncio.Future[Vector]]] = []
        self._background: list[tuple[str, asyncio.Future[Vector]]] = []
        self._draining = False
        self._closed = False
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="embedding-lane")
        self.passes = 0  # model runs so far; texts ÷ passes is the mean batch size
        self.texts = 0

    async def embed(self, text: str, *, background: bool = False) -> Vector:
        """The text's vector; raises what the embedding function raised. A `background`
        text (nobody is waiting for a reply on it) goes after replies' texts, but it
        gets at least a quarter of each pass while any waits."""
        future: asyncio.Future[Vector] = asyncio.get_running_loop().create_future()
        with self._lock:
            if self._closed:
                raise RuntimeError("the embedding lane is closed")
            (self._background if background else self._waiting).append((text, future))
            start, self._draining = not self._draining, True
        if start:
            self._thread.submit(self._drain)
        return await future

    def _drain(self) -> None:
        """On the lane's thread: passes until nothing waits."""
        while True:
            with self._lock:
                batch = self._next_batch()
                if not batch:
                    self._draining = False
                    return
            try:
                vectors = self._vectors([t for t, _ in batch])
            except Exception as err:
                log.warning("embedding %d text(s) failed: %s", len(batch), err)
                for _, future in batch:
                    _settle_soon(future, error=err)
                continue
            with self._lock:
                self.passes += 1
                self.texts += len(batch)
            for (_, future), vector in zip(batch, vectors, strict=True):
                _settle_soon(future, vector)

    def _next_batch(self) -> list[tuple[str, asyncio.Future[Vector]]]:
        """Up to `max_batch` waiting texts, replies' first; background texts keep a
        quarter of the pass (at least one text) while any wait. Cancelled callers'
        texts are dropped. Only under the lock."""
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
        """Let the thread go once its current pass (if any) ends; texts still waiting
        are not embedded and their callers are cancelled."""
        with self._lock:
            self._closed = True
            leftover = [*self._waiting, *self._background]
            self._waiting.clear()
            self._background.clear()
        for _, future in leftover:
            _settle_soon(future, cancel=True)
        self._thread.shutdown(wait=False, cancel_futures=True)

    def _vectors(self, texts: list[str]) -> list[Vector]:
        vectors = [np.asarray(v, dtype=np.float32) for v in self._embed_many(texts)]
        if len(vectors) != len(texts):
            raise RuntimeError(f"embedding returned {len(vectors)} vectors for {len(texts)} texts")
        return vectors


def _settle_soon(
    future: asyncio.Future[Vector],
    vector: Vector | None = None,
    *,
    error: BaseException | None = None,
    cancel: bool = False,
) -> None:
    """Settle a caller's future on its own loop, from any thread; a caller that has
    gone (cancelled, or its loop closed) is left alone."""

    def settle() -> None:
        if future.done():
            return
        if cancel:
            future.cancel()
        elif error is not None:
            future.set_exception(error)
        else:
            future.set_result(cast(Vector, vector))

    with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits
        future.get_loop().call_soon_threadsafe(settle)
