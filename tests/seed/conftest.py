"""The seed API suite: code written against the seed documents (../shared/seeds, 002 the
API contract, 003 the memory model, 004 the evidence score) must keep working.

Every expectation here comes from what those documents say, not from the code under
test. Seed-shaped code passes no `EngineConfig`, so the engine follows the one built
from the environment at import (`config.ENVIRONMENT`); each test here gets the
documents' values in its place, whatever the developer's shell sets. What the
configuration gives on its own is checked in a clean process (test_seed_config.py).
Nothing here reaches the network: the LLM is the loopback Anthropic fake through the
real SDK, and memories use the bundled embedding model.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from sonality import config
from sonality.config import EngineConfig
from sonality.memory.embedding import ensure_minilm_onnx
from tests.fakes.anthropic_fixtures import anthropic_server, llm  # noqa: F401

#: The built model the other test packages share (gitignored, built once).
MODEL_CACHE = Path(__file__).resolve().parents[2] / ".cache" / "test-models"

#: 002's configuration table: the values a fresh install runs with.
SEED_TUNABLES = EngineConfig(
    ess_threshold=0.3,
    bootstrap_dampening_until=10,
    opinion_cooling_period=3,
    semantic_retrieval_count=2,
    episodic_retrieval_count=3,
    reflection_every=20,
)


@pytest.fixture(autouse=True)
def seed_configuration(monkeypatch: pytest.MonkeyPatch) -> None:
    """The seed's values in place of the environment's, for code that passes none."""
    monkeypatch.setattr(config, "ENVIRONMENT", SEED_TUNABLES)


@pytest.fixture
def model_dir(monkeypatch: pytest.MonkeyPatch) -> Path:
    """Where a seed-shaped `EpisodeStore(path)` finds its model: the shared test copy,
    as SONALITY_MODEL_CACHE_DIR would say (the first build takes a few seconds)."""
    ensure_minilm_onnx(MODEL_CACHE)
    monkeypatch.setattr(config, "MODEL_CACHE_DIR", MODEL_CACHE)
    return MODEL_CACHE
