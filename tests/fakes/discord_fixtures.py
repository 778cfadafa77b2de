"""pytest fixtures and helpers shared by the Discord adapter and end-to-end tests."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator

import pytest
from discord.gateway import DiscordWebSocket
from discord.http import Route

from adapters.discord import DiscordAdapter
from bot.interface import ChatRuntime
from bot.settings import Settings
from tests.fakes.discord_server import RecordedRequest

MANAGE_GUILD = 1 << 5
SEND_MESSAGES = 1 << 11
EPHEMERAL = 1 << 6


@pytest.fixture(autouse=True)
def restores_discord_endpoints() -> Iterator[None]:
    """The adapter points discord.py at the fake; it must put Discord's URLs back."""
    base, gateway = Route.BASE, DiscordWebSocket.DEFAULT_GATEWAY
    yield
    assert Route.BASE == base, "adapter leaked its API base URL"
    assert DiscordWebSocket.DEFAULT_GATEWAY == gateway, "adapter leaked its gateway URL"
    Route.BASE, DiscordWebSocket.DEFAULT_GATEWAY = base, gateway


@contextlib.asynccontextmanager
async def running(
    runtime: ChatRuntime, settings: Settings, *, ready_within: float = 10.0
) -> AsyncIterator[DiscordAdapter]:
    """A started adapter once the fake's guilds arrived; closed (and start() awaited) after.

    If start() fails before READY, its own exception surfaces instead of a timeout.
    """
    adapter = DiscordAdapter(
        runtime,
        settings,
        client_options={"guild_ready_timeout": 0.05},
        identify_delay=0,
    )
    task = asyncio.create_task(adapter.start())
    ready = asyncio.create_task(adapter.wait_until_ready())
    done, _ = await asyncio.wait(
        {task, ready}, timeout=ready_within, return_when=asyncio.FIRST_COMPLETED
    )
    if ready not in done:
        ready.cancel()
        await adapter.close()
        await task
        raise AssertionError("adapter never became ready")
    try:
        yield adapter
    finally:
        await adapter.close()
        await asyncio.wait_for(task, 5)


def is_ephemeral(callback: RecordedRequest) -> bool:
    """Whether an interaction callback asked for a response only the caller sees."""
    return bool(int((callback.json.get("data") or {}).get("flags", 0)) & EPHEMERAL)
