"""pytest fixtures for the fake OpenAI server, importable from any test folder.

Like `anthropic_fixtures`, folders opt in explicitly in their own `conftest.py`:

    from tests.fakes.openai_fixtures import openai_server, openai_llm  # noqa: F401
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest_asyncio

from providers import DEFAULT_MODELS
from providers.openai import OpenAILLM
from tests.fakes.openai_server import OpenAIFake

FAKE_OPENAI_KEY = "sk-proj-test-0123456789"
#: The model tests pin, so they do not depend on SONALITY_MODEL.
OPENAI_TEST_MODEL = DEFAULT_MODELS["openai"][0]


@pytest_asyncio.fixture
async def openai_server() -> AsyncIterator[OpenAIFake]:
    """A fresh fake per test; it only accepts `FAKE_OPENAI_KEY`."""
    async with OpenAIFake(api_key=FAKE_OPENAI_KEY) as server:
        yield server


def openai_client_for(server: OpenAIFake, **overrides: Any) -> OpenAILLM:
    """The real SDK client pointed at `server`: 2 SDK retries, 2 s timeout, the
    model pinned to `OPENAI_TEST_MODEL`."""
    options: dict[str, Any] = {
        "api_key": FAKE_OPENAI_KEY,
        "base_url": server.base_url,
        "default_model": OPENAI_TEST_MODEL,
        "max_retries": 2,
        "timeout": 2.0,
        "max_concurrency": 4,
        **overrides,
    }
    return OpenAILLM(**options)


@pytest_asyncio.fixture
async def openai_llm(openai_server: OpenAIFake) -> AsyncIterator[OpenAILLM]:
    """`openai_client_for(openai_server)`, closed after the test."""
    client = openai_client_for(openai_server)
    try:
        yield client
    finally:
        await client.aclose()
