"""Fixtures for the evaluation tests: both vendors' loopback fakes and settings that
point the bot's own client at them, as an operator's environment would."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from bot.settings import Settings
from tests.fakes.anthropic_fixtures import FAKE_API_KEY, anthropic_server  # noqa: F401
from tests.fakes.anthropic_server import AnthropicFake
from tests.fakes.openai_fixtures import FAKE_OPENAI_KEY, openai_server  # noqa: F401
from tests.fakes.openai_server import OpenAIFake

LLMFake = AnthropicFake | OpenAIFake
MODEL_CACHE = Path(__file__).resolve().parents[2] / ".cache" / "test-models"


@pytest.fixture(params=["anthropic", "openai"])
def llm_server(request: pytest.FixtureRequest) -> LLMFake:
    """Each vendor's loopback fake in turn."""
    fake: LLMFake = request.getfixturevalue(f"{request.param}_server")
    return fake


def provider_env(server: LLMFake) -> dict[str, str]:
    """The settings an operator would set to use `server`'s vendor at its address."""
    if isinstance(server, OpenAIFake):
        return {
            "SONALITY_LLM_PROVIDER": "openai",
            "OPENAI_API_KEY": FAKE_OPENAI_KEY,
            "OPENAI_BASE_URL": server.base_url,
        }
    return {"ANTHROPIC_API_KEY": FAKE_API_KEY, "ANTHROPIC_BASE_URL": server.base_url}


def settings_for(server: LLMFake, data_dir: Path, **overrides: Any) -> Settings:
    values: dict[str, Any] = {
        **provider_env(server),
        "SONALITY_DATA_DIR": str(data_dir),
        "SONALITY_MODEL_CACHE_DIR": str(MODEL_CACHE),
        "SONALITY_LLM_MAX_RETRIES": 1,
        "SONALITY_LLM_TIMEOUT_SECONDS": 10,
        **overrides,
    }
    return Settings(_env_file=None, **values)  # type: ignore[call-arg]


def message_requests(server: LLMFake) -> list[Any]:
    """The LLM calls the server answered (not the start-up check's Models API lookups)."""
    return [r for r in server.requests if r.path.endswith(("/messages", "/chat/completions"))]
