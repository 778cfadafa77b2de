"""Shared fixtures for the memory tests.

The embedding function is built once into a persistent, gitignored cache dir so
repeated runs skip the ~1 s ONNX build and share one loaded model per test session.
Each test gets its own Chroma directory so tests never see each other's episodes.
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

MODEL_CACHE_DIR = Path(__file__).resolve().parents[2] / ".cache" / "test-models"


@pytest.fixture(scope="session")
def model_cache_dir() -> Path:
    ensure_minilm_onnx(MODEL_CACHE_DIR)
    return MODEL_CACHE_DIR


@pytest.fixture(scope="session")
def embedding_function(model_cache_dir: Path) -> FastMiniLML6V2:
    return default_embedding_function(model_cache_dir)


@pytest.fixture
def persist_dir(tmp_path: Path) -> Iterator[Path]:
    path = tmp_path / "chroma"
    yield path
    close_chroma_client(path)
