"""pytest fixtures shared by the Discord adapter and end-to-end tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from discord.gateway import DiscordWebSocket
from discord.http import Route


@pytest.fixture(autouse=True)
def restores_discord_endpoints() -> Iterator[None]:
    """The adapter points discord.py at the fake; it must put Discord's URLs back."""
    base, gateway = Route.BASE, DiscordWebSocket.DEFAULT_GATEWAY
    yield
    assert Route.BASE == base, "adapter leaked its API base URL"
    assert DiscordWebSocket.DEFAULT_GATEWAY == gateway, "adapter leaked its gateway URL"
    Route.BASE, DiscordWebSocket.DEFAULT_GATEWAY = base, gateway
