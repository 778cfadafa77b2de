"""pytest fixtures for the fake Anthropic server, importable from any test folder.

Why not a conftest: other folders opt in explicitly, either in their own `conftest.py`

    from tests.fakes.anthropic_fixtures import anthropic_server, llm  # noqa: F401

or with `pytest_plugins = ["tests.fakes.anthropic_fixtures"]` in the top-level
`tests/conftest.py` (pytest only allows `pytest_plugins` there).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest_asyncio

from providers.anthropic import AnthropicLLM
from sonality.config import DEFAULT_MODEL
from tests.fakes.anthropic_server import AnthropicFake

FAKE_API_KEY = "sk-ant-test-0123456789"


@pytest_asyncio.fixture
async def anthropic_server() -> AsyncIterator[AnthropicFake]:
    """A fresh fake per test; it only accepts `FAKE_API_KEY`."""
    async with AnthropicFake(api_key=FAKE_API_KEY) as server:
        yield server


def client_for(server: AnthropicFake, **overrides: Any) -> AnthropicLLM:
    """The real SDK client pointed at `server`: 2 SDK retries, 2 s timeout.

    The model is pinned to `DEFAULT_MODEL` so tests do not depend on SONALITY_MODEL.
    """
    options: dict[str, Any] = {
        "api_key": FAKE_API_KEY,
        "base_url": server.base_url,
        "default_model": DEFAULT_MODEL,
        "max_retries": 2,
        "timeout": 2.0,
        "max_concurrency": 4,
        **overrides,
    }
    return AnthropicLLM(**options)


@pytest_asyncio.fixture
async def llm(anthropic_server: AnthropicFake) -> AsyncIterator[AnthropicLLM]:
    """`client_for(anthropic_server)`, closed after the test."""
    client = client_for(anthropic_server)
    try:
        yield client
    finally:
        await client.aclose()
