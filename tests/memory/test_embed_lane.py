"""The embedding lane: one model pass at a time, waiting texts batched, each caller
getting exactly its own vector from the real MiniLM model."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator, Sequence
from typing import Any

import numpy as np
import pytest

from chroma_memory.embed_lane import EmbeddingLane
from chroma_memory.embedding import PASS_TOKENS, FastMiniLML6V2, similar_length_runs

TEXTS = [
    "Nuclear power is safer per terawatt-hour than coal.",
    "Sourdough needs a long cold proof.",
    "Protected bike lanes reduce injuries.",
    "Spaced repetition beats cramming for vocabulary.",
    "Land value taxes are hard to avoid.",
]


class GatedEmbedding:
    """The real model, with the first pass held until the test releases it, so the
    texts that arrive meanwhile are known to queue behind it."""

    def __init__(self, inner: FastMiniLML6V2) -> None:
        self.inner = inner
        self.release = threading.Event()
        self.started = threading.Event()
        self.batches: list[list[str]] = []
        self.fail_next = False

    def __call__(self, texts: list[str]) -> Sequence[Any]:
        self.batches.append(list(texts))
        self.started.set()
        if len(self.batches) == 1:
            self.release.wait(10)
        if self.fail_next:
            self.fail_next = False
            raise RuntimeError("model exploded")
        return self.inner(texts)


@contextlib.asynccontextmanager
async def held_lane(
    embedding_function: FastMiniLML6V2, first_text: str
) -> AsyncIterator[tuple[GatedEmbedding, EmbeddingLane]]:
    """A lane whose first pass (of `first_text`) is running and held until the test sets
    `gated.release`; on leaving, that pass has finished and the lane is closed."""
    gated = GatedEmbedding(embedding_function)
    lane = EmbeddingLane(gated)
    try:
        first = asyncio.create_task(lane.embed(first_text))
        await asyncio.to_thread(gated.started.wait, 10)
        yield gated, lane
        await first
    finally:
        gated.release.set()
        lane.close()


def is_own_vector(embedding_function: FastMiniLML6V2, text: str, vector: Any) -> bool:
    """The text's lone embedding, not a neighbour's in the batch."""
    return float(np.asarray(vector) @ np.asarray(embedding_function([text])[0])) > 0.9999


async def test_texts_waiting_behind_a_pass_share_the_next_one(
    embedding_function: FastMiniLML6V2,
) -> None:
    async with held_lane(embedding_function, "warm-up message") as (gated, lane):
        rest = [asyncio.create_task(lane.embed(text)) for text in TEXTS]
        await asyncio.sleep(0.05)
        assert len(gated.batches) == 1  # nothing else ran while the first pass was held
        gated.release.set()
        vectors = await asyncio.gather(*rest)

    assert gated.batches == [["warm-up message"], TEXTS]
    assert (lane.passes, lane.texts) == (2, 6)
    for text, vector in zip(TEXTS, vectors, strict=True):
        assert vector.shape == (384,)
        assert is_own_vector(embedding_function, text, vector)


async def test_a_failed_pass_fails_its_callers_only(embedding_function: FastMiniLML6V2) -> None:
    gated = GatedEmbedding(embedding_function)
    gated.release.set()
    gated.fail_next = True
    lane = EmbeddingLane(gated)
    try:
        with pytest.raises(RuntimeError, match="model exploded"):
            await lane.embed(TEXTS[0])
        vector = await lane.embed(TEXTS[0])  # the lane still works afterwards
    finally:
        lane.close()
    assert is_own_vector(embedding_function, TEXTS[0], vector)


async def test_a_cancelled_caller_does_not_disturb_the_others(
    embedding_function: FastMiniLML6V2,
) -> None:
    async with held_lane(embedding_function, "held") as (gated, lane):
        dropped = asyncio.create_task(lane.embed(TEXTS[0]))
        kept = asyncio.create_task(lane.embed(TEXTS[1]))
        await asyncio.sleep(0)
        dropped.cancel()
        gated.release.set()
        vector = await kept
    assert gated.batches[1] == [TEXTS[1]]  # the cancelled text was never embedded
    assert dropped.cancelled()
    assert is_own_vector(embedding_function, TEXTS[1], vector)


def test_a_long_text_gets_a_run_of_its_own() -> None:
    lengths = np.array([10, 12, 300, 11, 25, 9])
    order = np.argsort(lengths, kind="stable")
    runs = [lengths[run].tolist() for run in similar_length_runs(order, lengths, size=32)]
    assert runs == [[9, 10, 11, 12, 25], [300]]
    sized = [len(run) for run in similar_length_runs(order, lengths, size=2)]
    assert sized == [2, 2, 1, 1]


def test_long_texts_are_embedded_a_few_at_a_time_and_chat_sized_ones_together() -> None:
    """A pass's memory grows with texts × length², so a burst of long messages is split
    into passes of at most PASS_TOKENS padded tokens; chat-sized texts still go 32 at once.
    """
    long_burst = np.array([256] * 32)
    order = np.argsort(long_burst, kind="stable")
    runs = list(similar_length_runs(order, long_burst, size=32))
    assert [len(run) for run in runs] == [PASS_TOKENS // 256] * (32 * 256 // PASS_TOKENS)
    assert sorted(int(i) for run in runs for i in run) == list(range(32))  # none lost
    chat = np.array([40] * 32)
    assert [len(run) for run in similar_length_runs(order, chat, size=32)] == [32]
    rising = np.array([100, 150, 190, 200, 210, 220, 230, 240, 250, 256])
    order = np.argsort(rising, kind="stable")
    for run in similar_length_runs(order, rising, size=32):
        assert len(run) == 1 or len(run) * int(rising[run].max()) <= PASS_TOKENS


def test_batched_vectors_match_single_ones(embedding_function: FastMiniLML6V2) -> None:
    """Padding a short text up to a longer neighbour must not change its vector."""
    texts = [*TEXTS, "word " * 150]
    together = embedding_function(texts)
    for text, vector in zip(texts, together, strict=True):
        assert is_own_vector(embedding_function, text, vector)


async def test_replies_texts_go_first_and_learning_keeps_a_share(
    embedding_function: FastMiniLML6V2,
) -> None:
    """Summaries queued for learning must not hold up a reply's text, nor be starved by
    a stream of replies: a quarter of each pass (here one text of four) stays theirs."""
    gated = GatedEmbedding(embedding_function)
    lane = EmbeddingLane(gated, max_batch=4)
    learning = [f"summary {i}: {text}" for i, text in enumerate([*TEXTS, TEXTS[0]])]
    replies = [f"message {i}: {text}" for i, text in enumerate(TEXTS[:4])]
    try:
        first = asyncio.create_task(lane.embed("held"))
        await asyncio.to_thread(gated.started.wait, 10)
        waiting = [asyncio.create_task(lane.embed(t, background=True)) for t in learning]
        waiting += [asyncio.create_task(lane.embed(t)) for t in replies]
        await asyncio.sleep(0)
        gated.release.set()
        vectors = await asyncio.gather(first, *waiting)
    finally:
        gated.release.set()
        lane.close()
    assert gated.batches[1:] == [
        [*replies[:3], learning[0]],
        [replies[3], *learning[1:4]],
        learning[4:],
    ]
    for text, vector in zip([*learning, *replies], vectors[1:], strict=True):
        assert is_own_vector(embedding_function, text, vector)


async def test_the_next_pass_starts_while_the_event_loop_is_busy(
    embedding_function: FastMiniLML6V2,
) -> None:
    """The lane's thread takes the next batch itself: a busy event loop (here: blocked
    outright) must not leave it idle with texts waiting."""
    second_pass = threading.Event()

    def embed(texts: list[str]) -> Sequence[Any]:
        if gated.batches:
            second_pass.set()
        return gated(texts)

    gated = GatedEmbedding(embedding_function)
    lane = EmbeddingLane(embed)
    try:
        first = asyncio.create_task(lane.embed("held"))
        await asyncio.to_thread(gated.started.wait, 10)
        queued = asyncio.create_task(lane.embed(TEXTS[0]))
        await asyncio.sleep(0)
        gated.release.set()
        started_with_the_loop_blocked = second_pass.wait(10)  # blocks this loop on purpose
        vectors = await asyncio.gather(first, queued)
    finally:
        gated.release.set()
        lane.close()
    assert started_with_the_loop_blocked
    assert gated.batches == [["held"], [TEXTS[0]]]
    assert is_own_vector(embedding_function, TEXTS[0], vectors[1])


async def test_closing_cancels_the_texts_still_waiting(
    embedding_function: FastMiniLML6V2,
) -> None:
    async with held_lane(embedding_function, "held") as (gated, lane):
        waiting = asyncio.create_task(lane.embed(TEXTS[0]))
        await asyncio.sleep(0)
        lane.close()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        with pytest.raises(RuntimeError, match="closed"):
            await lane.embed(TEXTS[1])
        gated.release.set()
    assert gated.batches == [["held"]]
