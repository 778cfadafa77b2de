"""Timing figures for the local MiniLM embedding function and episode retrieval.

Why: retrieval runs on every message in every community, so its cost is part of the
per-message latency budget; these numbers show what one process can sustain.

Run: ``.venv/bin/python bench/embedding_bench.py`` (works offline; uses a temp dir).
Prints one line per figure.
"""

from __future__ import annotations

import multiprocessing
import random
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import psutil
from chromadb.utils.embedding_functions.onnx_mini_lm_l6_v2 import ONNXMiniLM_L6_V2

from chroma_memory.community_store import CommunityEpisodeStore
from chroma_memory.embedding import FastMiniLML6V2, close_chroma_client, ensure_minilm_onnx
from sonality.memory.episodes import Episode

TOPICS = [
    "nuclear power",
    "sourdough",
    "football tactics",
    "tax policy",
    "solar panels",
    "city cycling",
    "jazz records",
    "chess openings",
    "rent control",
    "space probes",
]
VERBS = ["argued about", "asked about", "doubted claims on", "shared data on", "joked about"]


def sentences(n: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    return [
        f"User {rng.choice(VERBS)} {rng.choice(TOPICS)} and {rng.choice(TOPICS)} (#{i})"
        for i in range(n)
    ]


def timed(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def median_ms(fn: Callable[[], object], repeat: int = 30) -> float:
    fn()  # warm-up
    return statistics.median(timed(fn) for _ in range(repeat)) * 1000


def memory_kept(models: Path) -> float:
    """MB a burst of long messages leaves the process holding (each text is cut at 256
    tokens), measured in a process that has embedded nothing else."""
    int8 = FastMiniLML6V2(models, quantized=True)
    int8(["warm-up"])
    process = psutil.Process()
    before = process.memory_full_info().uss
    int8([" ".join(sentences(40, seed=i)) for i in range(32)])
    return (process.memory_full_info().uss - before) / 2**20


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        build_s = timed(lambda: ensure_minilm_onnx(root / "models"))
        print(f"build onnx model from safetensors: {build_s:.2f} s")
        ef = FastMiniLML6V2(root / "models")
        print(f"load tokenizer + onnx session: {timed(ef._load):.2f} s")

        texts = sentences(1000)
        print(f"embed 1,000 short sentences (fast): {timed(lambda: ef(texts)):.2f} s")
        stock = ONNXMiniLM_L6_V2()
        stock.DOWNLOAD_PATH = root / "models"
        few = texts[:32]
        stock_s = timed(lambda: stock(few))
        fast_s = timed(lambda: ef(few))
        print(
            f"embed 32 short sentences: stock {stock_s:.2f} s, fast {fast_s:.3f} s "
            f"({stock_s / fast_s:.0f}x)"
        )

        with multiprocessing.get_context("spawn").Pool(1) as fresh:
            kept = fresh.apply(memory_kept, (root / "models",))
        print(
            f"memory kept after embedding 32 texts of 256 tokens at once (int8 model, "
            f"fresh process): {kept:+.0f} MB"
        )

        persist = root / "chroma"
        store = CommunityEpisodeStore.for_community("discord:bench", persist, embedding_function=ef)
        n = 10_000
        rng = np.random.default_rng(0)
        vectors = rng.standard_normal((n, 384)).astype(np.float32)
        vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
        docs = sentences(n, seed=1)
        start = time.perf_counter()
        for lo in range(0, n, 1000):
            store.store_many(
                [
                    Episode(
                        id=f"e{i}",
                        user_message=docs[i],
                        ess_score=0.5,
                        summary=docs[i],
                        interaction=i,
                        embedding=tuple(vectors[i].tolist()),
                    )
                    for i in range(lo, lo + 1000)
                ]
            )
        print(f"insert 10,000 precomputed vectors: {time.perf_counter() - start:.2f} s")
        query = "Is atomic energy dangerous?"
        print(f"embed one query: {median_ms(lambda: ef([query])):.1f} ms")
        print(
            f"retrieve at 10,000 items (embed+query+rerank): "
            f"{median_ms(lambda: store.retrieve(query, min_relevance=-1.0)):.1f} ms"
        )
        where = {"interaction": {"$gte": n - 500}}
        print(
            f"retrieve at 10,000 items with where filter: "
            f"{median_ms(lambda: store.retrieve(query, min_relevance=-1.0, where=where)):.1f} ms"
        )
        print(
            f"retrieve_typed at 10,000 items (one embed, two passes): "
            f"{median_ms(lambda: store.retrieve_typed(query, min_relevance=-1.0)):.1f} ms"
        )
        close_chroma_client(persist)


if __name__ == "__main__":
    main()
