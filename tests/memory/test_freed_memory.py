"""Chroma's index files hold no memory the process freed (sonality/memory/freed_memory.py).

Each run is a fresh process that stores memories in twenty collections through the bot's
Chroma client. Two kinds of freed memory are planted, as a bot leaves them between
writes: a heap's worth of a marker freed before every write (pictures, request bodies),
and memories whose text is the marker, which Chroma's own threads copy and free in small
chunks (a summary, an error quoting it). With one malloc arena (`MALLOC_ARENA_MAX=1`)
Chroma's threads take their buffers from the heap the marker was freed to, as they do in
a long-running bot once its arenas are shared.
"""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from sonality.memory.freed_memory import scrubbing_environment

pytestmark = pytest.mark.skipif(
    platform.libc_ver()[0] != "glibc", reason="scrubbing needs glibc's mallopt"
)

MARKER = "FREED-BYTES-"

STORE = """
import random, sys
from pathlib import Path

import sonality.memory.freed_memory as freed_memory
from chroma_memory.embedding import close_chroma_client, make_chroma_client

if sys.argv[2] == "off":
    freed_memory._scrubbing = False  # as if the C library could not scrub
marker = sys.argv[3]
path = Path(sys.argv[1])
client = make_chroma_client(path)
rng = random.Random(7)
for k in range(20):
    memories = client.get_or_create_collection(
        f"community-{k:02d}",
        configuration={"hnsw": {"space": "cosine", "sync_threshold": 2}},
        embedding_function=None,
    )
    for size in (100, 300, 400, 800):
        freed = [bytearray(marker.encode() * 300) for _ in range(50)]
        del freed
        memories.add(
            ids=[f"{k}-{size}"],
            embeddings=[[rng.random() for _ in range(384)]],
            documents=[(marker * 100)[:size]],
        )
close_chroma_client(path)
"""


def marker_copies(root: Path, scrub: str, env: dict[str, str]) -> Counter[str]:
    """Store memories in a fresh process; the marker's copies per file name, apart from
    Chroma's SQLite file, which holds the memories' text by design."""
    subprocess.run(
        [sys.executable, "-c", STORE, str(root), scrub, MARKER],
        check=True,
        env={**env, "MALLOC_ARENA_MAX": "1"},
        cwd=Path(__file__).parents[2],
        timeout=300,
    )
    copies: Counter[str] = Counter()
    for path in root.rglob("*"):
        if path.is_file() and path.name != "chroma.sqlite3":
            copies[path.name] += path.read_bytes().count(MARKER.encode())
    assert {"data_level0.bin", "length.bin"} <= set(copies), "no index was saved"
    return copies


def without_tunables() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k != "GLIBC_TUNABLES"}


def test_under_the_bots_settings_no_index_file_holds_freed_memory(tmp_path: Path) -> None:
    copies = marker_copies(tmp_path / "chroma", "on", scrubbing_environment(without_tunables()))
    assert sum(copies.values()) == 0, copies


def test_run_time_scrubbing_alone_keeps_the_large_buffer_clean(tmp_path: Path) -> None:
    """A program that only imports the engine: `data_level0.bin` stays clean. The small
    chunks (`length.bin`) are reached only by the settings a process starts with."""
    copies = marker_copies(tmp_path / "chroma", "on", without_tunables())
    assert copies["data_level0.bin"] == 0, copies


def test_without_scrubbing_the_index_files_carry_freed_memory(tmp_path: Path) -> None:
    """What the scrubbing prevents, shown (so the tests above can fail): if Chroma starts
    clearing its buffers, this fails and the scrubbing can go."""
    copies = marker_copies(tmp_path / "chroma", "off", without_tunables())
    assert copies["data_level0.bin"] > 0, copies
    assert copies["length.bin"] > 0, copies
