"""Shared fixtures: the real runtime, real SDK, real Chroma + embeddings, fake LLM server.

A test that takes `llm_server` runs once per vendor (Anthropic, then OpenAI), with `llm`
and `runtime` built for that vendor; a test that takes `anthropic_server` instead runs
against Anthropic only.

With SONALITY_TEST_CHROMA=server in the environment, every runtime made by
`make_settings` keeps its episodes in a real Chroma server (`chroma run`, one per
session) instead of the embedded directory, each test in a database of its own:
`SONALITY_TEST_CHROMA=server pytest tests/integration/test_pipeline.py`. Tests that
check the embedded path itself (the memory process) fail that way, as they should.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from bot.app import open_runtime
from bot.messages import CommandRequest, CommandResult, Community, IncomingMessage, Reply, User
from bot.runtime import Runtime
from bot.settings import Settings
from providers.anthropic import AnthropicLLM
from providers.openai import OpenAILLM
from tests.chroma_server import ChromaServer, chroma_server, running_chroma_server  # noqa: F401
from tests.fakes.anthropic_fixtures import anthropic_server, client_for  # noqa: F401
from tests.fakes.anthropic_server import AnthropicFake
from tests.fakes.openai_fixtures import openai_client_for, openai_server  # noqa: F401
from tests.fakes.openai_server import OpenAIFake

LLMFake = AnthropicFake | OpenAIFake

MODEL_CACHE = Path(__file__).resolve().parents[2] / ".cache" / "test-models"
A = Community(id="test:alpha", name="Alpha")
B = Community(id="test:beta", name="Beta")
ALICE = User(id="u-alice", name="Alice")
BOB = User(id="u-bob", name="Bob")


#: The session's Chroma server when SONALITY_TEST_CHROMA=server (set by `_chroma_stack`).
_CHROMA_SERVER: list[ChromaServer] = []


@pytest.fixture(scope="session", autouse=True)
def _chroma_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    if os.environ.get("SONALITY_TEST_CHROMA") != "server":
        yield
        return
    with running_chroma_server(tmp_path_factory.mktemp("stack-chroma") / "data") as server:
        _CHROMA_SERVER.append(server)
        try:
            yield
        finally:
            _CHROMA_SERVER.clear()


def make_settings(data_dir: Path, *, llm: object = None, **overrides: Any) -> Settings:
    """Test settings; with an OpenAI `llm`, the provider (and so the default models) is
    OpenAI's, as the fake OpenAI server knows only its vendor's models. Each data
    directory gets its own database on the session's Chroma server, if there is one,
    so a restart in the same directory finds its episodes again."""
    values: dict[str, Any] = {
        "SONALITY_DATA_DIR": str(data_dir),
        "SONALITY_MODEL_CACHE_DIR": str(MODEL_CACHE),
        "SONALITY_RATE_LIMIT_MESSAGES": 10_000,
        "SONALITY_NIGHTLY_JITTER_SECONDS": 0,
    }
    if _CHROMA_SERVER:
        values["CHROMA_URL"] = _CHROMA_SERVER[0].url
        values["SONALITY_CHROMA_DATABASE"] = (
            "t" + hashlib.sha256(str(data_dir.resolve()).encode()).hexdigest()[:32]
        )
    if isinstance(llm, OpenAILLM):
        values["SONALITY_LLM_PROVIDER"] = "openai"
    values.update(overrides)
    return Settings(_env_file=None, **values)  # type: ignore[call-arg]


@pytest.fixture(params=["anthropic", "openai"])
def llm_server(request: pytest.FixtureRequest) -> LLMFake:
    """Each vendor's loopback fake in turn (for Anthropic, `anthropic_server` itself)."""
    fake: LLMFake = request.getfixturevalue(f"{request.param}_server")
    return fake


@pytest.fixture
def llm_target(request: pytest.FixtureRequest) -> LLMFake:
    """The fake `llm` talks to: the test's `llm_server` if it takes one, else Anthropic's."""
    name = "llm_server" if "llm_server" in request.fixturenames else "anthropic_server"
    fake: LLMFake = request.getfixturevalue(name)
    return fake


@pytest_asyncio.fixture
async def llm(llm_target: LLMFake) -> AsyncIterator[AnthropicLLM | OpenAILLM]:
    """The real SDK client of `llm_target`'s vendor, closed after the test."""
    client: AnthropicLLM | OpenAILLM = (
        openai_client_for(llm_target)
        if isinstance(llm_target, OpenAIFake)
        else client_for(llm_target)
    )
    try:
        yield client
    finally:
        await client.aclose()


@pytest.fixture
def database_url() -> str | None:
    """Where `runtime` keeps its state: None, the SQLite file in the data directory. A
    module overrides this (see test_pipeline.py) to run its tests on PostgreSQL too."""
    return None


@pytest_asyncio.fixture
async def runtime(
    tmp_path: Path, llm: AnthropicLLM | OpenAILLM, database_url: str | None
) -> AsyncIterator[Runtime]:
    extra = {} if database_url is None else {"DATABASE_URL": database_url}
    settings = make_settings(tmp_path / "data", llm=llm, **extra)
    async with open_runtime(settings, llm=llm) as rt:
        yield rt


def chat_requests(server: Any) -> list[Any]:
    """Requests for a chat reply (not ESS, insight or reflection calls)."""
    return [r for r in server.requests if "<personality_state>" in r.system_text]


def prompt_of(request: Any) -> str:
    """Everything a chat request showed the model: system prompt and every turn (the
    memories travel in the newest turn, after the cached conversation)."""
    return (
        str(request.system_text) + "\n" + "\n".join(str(m.get("content")) for m in request.messages)
    )


def ess_requests(server: Any) -> list[Any]:
    return [r for r in server.requests if r.tool_name == "classify_evidence"]


async def eventually(condition: Callable[[], bool], seconds: float) -> bool:
    """Poll `condition` for work that finishes in the background; its last value."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds
    while loop.time() < deadline:
        if condition():
            return True
        await asyncio.sleep(0.01)
    return condition()


async def say(
    runtime: Runtime, text: str, community: Community = A, user: User = ALICE
) -> Reply | None:
    """Send one addressed message and wait until its learning has been committed."""
    reply = await runtime.handle(
        IncomingMessage(community=community, channel_id="c1", user=user, text=text)
    )
    await runtime.drain()
    return reply


async def command(
    runtime: Runtime,
    name: str,
    *args: str,
    community: Community = A,
    user: User = ALICE,
    moderator: bool = True,
) -> CommandResult:
    return await runtime.run_command(
        CommandRequest(
            community=community, caller=user, is_moderator=moderator, name=name, args=args
        )
    )
