"""A real runtime and the real Discord adapter on the fake Discord, in one guild: for
tests whose members talk and run commands through discord.py."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from adapters.discord import DiscordAdapter
from app.wiring import open_runtime
from bot.runtime import Runtime
from tests.fakes.discord_fixtures import running
from tests.fakes.discord_server import FakeDiscord, FakeGuild, FakeUser
from tests.integration.conftest import make_settings

WAIT = 10.0


@dataclass
class GuildBot:
    fake: FakeDiscord
    guild: FakeGuild
    runtime: Runtime
    adapter: DiscordAdapter


@contextlib.asynccontextmanager
async def guild_bot(
    data_dir: Path, llm: Any, people: Sequence[FakeUser], **settings: Any
) -> AsyncIterator[GuildBot]:
    """The bot in "Guild A" with `people` as its members; `settings` as for
    `make_settings`."""
    fake = FakeDiscord()
    guild = fake.add_guild("Guild A", members=list(people))
    await fake.start()
    values = make_settings(
        data_dir,
        DISCORD_TOKEN="test-token",
        DISCORD_API_BASE_URL=fake.api_base,
        DISCORD_GATEWAY_URL=fake.gateway_url,
        **settings,
    )
    try:
        async with (
            open_runtime(values, llm=llm) as runtime,
            running(runtime, values, ready_within=WAIT) as adapter,
        ):
            yield GuildBot(fake, guild, runtime, adapter)
    finally:
        await fake.close()
