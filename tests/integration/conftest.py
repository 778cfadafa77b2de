"""Shared fixtures: the real runtime, real SDK, real Chroma + embeddings, fake LLM server."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest_asyncio

from bot.app import open_runtime
from bot.messages import CommandRequest, CommandResult, Community, IncomingMessage, Reply, User
from bot.runtime import Runtime
from bot.settings import Settings
from tests.fakes.anthropic_fixtures import anthropic_server, llm  # noqa: F401

MODEL_CACHE = Path(__file__).resolve().parents[2] / ".cache" / "test-models"
A = Community(id="test:alpha", name="Alpha")
B = Community(id="test:beta", name="Beta")
ALICE = User(id="u-alice", name="Alice")
BOB = User(id="u-bob", name="Bob")


def make_settings(data_dir: Path, **overrides: Any) -> Settings:
    values: dict[str, Any] = {
        "SONALITY_DATA_DIR": str(data_dir),
        "SONALITY_MODEL_CACHE_DIR": str(MODEL_CACHE),
        "SONALITY_RATE_LIMIT_MESSAGES": 10_000,
        "SONALITY_NIGHTLY_JITTER_SECONDS": 0,
    }
    values.update(overrides)
    return Settings(_env_file=None, **values)  # type: ignore[call-arg]


@pytest_asyncio.fixture
async def runtime(tmp_path: Path, llm: Any) -> AsyncIterator[Runtime]:  # noqa: F811
    async with open_runtime(make_settings(tmp_path / "data"), llm=llm) as rt:
        yield rt


def chat_requests(server: Any) -> list[Any]:
    """Requests for a chat reply (not ESS, insight or reflection calls)."""
    return [r for r in server.requests if "<personality_state>" in r.system_text]


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
