"""Opt this folder into the fake Anthropic server fixtures (`anthropic_server`, `llm`),
and `vendor`: each vendor's fake with its real SDK client, in turn."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Literal

import pytest
import pytest_asyncio

from providers.anthropic import AnthropicLLM
from providers.openai import OpenAILLM
from tests.fakes.anthropic_fixtures import (  # noqa: F401  (fixtures)
    FAKE_API_KEY,
    anthropic_server,
    client_for,
    llm,
)
from tests.fakes.anthropic_server import AnthropicFake
from tests.fakes.openai_fixtures import FAKE_OPENAI_KEY, openai_client_for
from tests.fakes.openai_server import OpenAIFake


@dataclass
class Vendor:
    name: Literal["anthropic", "openai"]
    server: AnthropicFake | OpenAIFake
    client: AnthropicLLM | OpenAILLM

    def stream_requests(self) -> int:
        return sum(1 for r in self.server.requests if r.body.get("stream") is True)


@pytest_asyncio.fixture(params=["anthropic", "openai"])
async def vendor(request: pytest.FixtureRequest) -> AsyncIterator[Vendor]:
    if request.param == "anthropic":
        async with AnthropicFake(api_key=FAKE_API_KEY) as server:
            client = client_for(server, max_retries=0)
            try:
                yield Vendor("anthropic", server, client)
            finally:
                await client.aclose()
    else:
        async with OpenAIFake(api_key=FAKE_OPENAI_KEY) as oserver:
            oclient = openai_client_for(oserver, max_retries=0)
            try:
                yield Vendor("openai", oserver, oclient)
            finally:
                await oclient.aclose()
