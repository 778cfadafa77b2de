"""Shared fixtures: the real runtime, real SDK, real Chroma + embeddings, fake LLM server.

A test that takes `llm_server` runs once per vendor (Anthropic, then OpenAI), with `llm`
and `runtime` built for that vendor; a test that takes `anthropic_server` instead runs
against Anthropic only.

Every test runs on a `stack` (tests/stack.py): by default the embedded one (SQLite and
a local Chroma directory); a test or module marked `on_every_stack` runs on the
scale-out stack too (the session's PostgreSQL and Chroma server). `make_settings` and
`runtime` put the bot on the test's stack. SONALITY_TEST_STACK in the environment
changes the default for every other test (`SONALITY_TEST_STACK=postgresql+chroma-server
pytest tests/integration/test_my_data.py`); SONALITY_TEST_CHROMA=server, kept from
before, means SQLite plus the Chroma server. Tests that check the embedded path itself
fail that way, as they should.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from app.wiring import open_runtime
from bot.messages import CommandRequest, CommandResult, Community, IncomingMessage, Reply, User
from bot.runtime import Runtime
from bot.settings import Settings
from chroma_memory.embedding import ensure_minilm_int8
from providers.anthropic import AnthropicLLM
from providers.openai import OpenAILLM
from tests.chroma_server import chroma_server  # noqa: F401
from tests.fakes.anthropic_fixtures import anthropic_server, client_for  # noqa: F401
from tests.fakes.anthropic_server import AnthropicFake
from tests.fakes.openai_fixtures import openai_client_for, openai_server  # noqa: F401
from tests.fakes.openai_server import OpenAIFake
from tests.stack import CHROMA_SERVER_ONLY, EMBEDDED, Stack, open_stack

LLMFake = AnthropicFake | OpenAIFake

MODEL_CACHE = Path(__file__).resolve().parents[2] / ".cache" / "test-models"


@pytest.fixture(scope="session", autouse=True)
def _models_built() -> None:
    """The embedding models the bots under test load, built once before any test: the
    int8 copy takes seconds to quantize, which a fresh checkout would otherwise pay
    inside whichever test first starts a bot, against its timeouts."""
    ensure_minilm_int8(MODEL_CACHE)


A = Community(id="test:alpha", name="Alpha")
B = Community(id="test:beta", name="Beta")
ALICE = User(id="u-alice", name="Alice")
BOB = User(id="u-bob", name="Bob")


#: The running test's stack, which `make_settings` applies (set by `_on_stack`).
_STACK: list[Stack] = []


@pytest.fixture
def stack(request: pytest.FixtureRequest) -> Iterator[Stack]:
    """The engines this test's bot runs on; `on_every_stack` parametrizes it."""
    default = os.environ.get("SONALITY_TEST_STACK") or (
        CHROMA_SERVER_ONLY if os.environ.get("SONALITY_TEST_CHROMA") == "server" else EMBEDDED
    )
    chosen = open_stack(getattr(request, "param", default), request)
    try:
        yield chosen
    finally:
        chosen.close()


@pytest.fixture(autouse=True)
def _on_stack(stack: Stack) -> Iterator[None]:
    _STACK.append(stack)
    try:
        yield
    finally:
        _STACK.remove(stack)


def make_settings(data_dir: Path, *, llm: object = None, **overrides: Any) -> Settings:
    """Test settings; with an OpenAI `llm`, the provider (and so the default models) is
    OpenAI's, as the fake OpenAI server knows only its vendor's models. The bot is put
    on the running test's stack: on the scale-out stack each data directory has its
    own PostgreSQL and Chroma databases, so a restart in the same directory finds its
    state and episodes again. `overrides` win over the stack."""
    values: dict[str, Any] = {
        "SONALITY_DATA_DIR": str(data_dir),
        "SONALITY_MODEL_CACHE_DIR": str(MODEL_CACHE),
        "SONALITY_RATE_LIMIT_MESSAGES": 10_000,
        "SONALITY_NIGHTLY_JITTER_SECONDS": 0,
    }
    if _STACK:
        values.update(_STACK[-1].settings(data_dir))
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
def database_url(stack: Stack, tmp_path: Path) -> str | None:
    """Where `runtime` keeps its state: None, the SQLite file in the data directory, or
    the stack's PostgreSQL database for it. A module may override this."""
    return stack.database_url(tmp_path / "data")


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
