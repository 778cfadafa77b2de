"""Shared fixtures for the memory tests.

The embedding function is built once into a persistent, gitignored cache dir so
repeated runs skip the ~1 s ONNX build and share one loaded model per test session.
Each test gets its own Chroma directory so tests never see each other's episodes.

A test taking `chroma` runs twice: on embedded Chroma (`SharedChroma` on the test's
directory) and on a real Chroma server (`chroma run`, one per session), where it gets a
database of its own.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from chroma_memory.embedding import (
    FastMiniLML6V2,
    close_chroma_client,
    default_embedding_function,
    ensure_minilm_onnx,
)
from chroma_memory.server import ServerChroma
from chroma_memory.shared_chroma import ChromaHandle, SharedChroma
from tests.chroma_server import ChromaServer, chroma_server  # noqa: F401

MODEL_CACHE_DIR = Path(__file__).resolve().parents[2] / ".cache" / "test-models"


@pytest.fixture(scope="session")
def model_cache_dir() -> Path:
    ensure_minilm_onnx(MODEL_CACHE_DIR)
    return MODEL_CACHE_DIR


@pytest.fixture(scope="session")
def embedding_function(model_cache_dir: Path) -> FastMiniLML6V2:
    return default_embedding_function(model_cache_dir)


@pytest.fixture(scope="session")
def int8_embedding_function(model_cache_dir: Path) -> FastMiniLML6V2:
    """The model the bot runs by default (SONALITY_EMBEDDING_INT8)."""
    return default_embedding_function(model_cache_dir, quantized=True)


@pytest.fixture
def persist_dir(tmp_path: Path) -> Iterator[Path]:
    path = tmp_path / "chroma"
    yield path
    close_chroma_client(path)


@pytest.fixture(params=["embedded", "server"])
def chroma(request: pytest.FixtureRequest, persist_dir: Path) -> Iterator[ChromaHandle]:
    """The client every community shares: embedded, then a Chroma server's."""
    if request.param == "embedded":
        yield SharedChroma(persist_dir)
        return
    server: ChromaServer = request.getfixturevalue("chroma_server")
    remote = ServerChroma(server.url, database=server.fresh_database())
    try:
        yield remote
    finally:
        remote.close()
