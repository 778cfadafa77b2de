"""The seed API suite: code written against the seed documents (../shared/seeds, 002 the
API contract, 003 the memory model, 004 the evidence score) must keep working.

Every expectation here comes from what those documents say, not from the code under
test. The engine's tunables are read from the environment at import, so each test
runs with the documents' values whatever the developer's shell sets; what the
configuration gives on its own is checked in a clean process (test_seed_config.py).
Nothing here reaches the network: the LLM is the loopback Anthropic fake through the
real SDK, and memories use the bundled embedding model.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from sonality import config
from sonality.memory.embedding import ensure_minilm_onnx
from tests.fakes.anthropic_fixtures import anthropic_server, llm  # noqa: F401

#: The built model the other test packages share (gitignored, built once).
MODEL_CACHE = Path(__file__).resolve().parents[2] / ".cache" / "test-models"

#: 002's configuration table: the values a fresh install runs with.
SEED_TUNABLES = {
    "ESS_THRESHOLD": 0.3,
    "BOOTSTRAP_DAMPENING_UNTIL": 10,
    "OPINION_COOLING_PERIOD": 3,
    "SEMANTIC_RETRIEVAL_COUNT": 2,
    "EPISODIC_RETRIEVAL_COUNT": 3,
    "EPISODE_RETRIEVAL_COUNT": 5,
    "REFLECTION_EVERY": 20,
}


@pytest.fixture(autouse=True)
def seed_configuration(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in SEED_TUNABLES.items():
        monkeypatch.setattr(config, name, value)


@pytest.fixture
def model_dir(monkeypatch: pytest.MonkeyPatch) -> Path:
    """Where a seed-shaped `EpisodeStore(path)` finds its model: the shared test copy,
    as SONALITY_MODEL_CACHE_DIR would say (the first build takes a few seconds)."""
    ensure_minilm_onnx(MODEL_CACHE)
    monkeypatch.setattr(config, "MODEL_CACHE_DIR", MODEL_CACHE)
    return MODEL_CACHE
