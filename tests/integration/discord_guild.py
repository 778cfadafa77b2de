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
from tests.fakes.discord_server import FakeChannel, FakeDiscord, FakeGuild, FakeUser
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
    try:
        async with bot_on(fake, data_dir, llm, **settings) as (runtime, adapter):
            yield GuildBot(fake, guild, runtime, adapter)
    finally:
        await fake.close()


@contextlib.asynccontextmanager
async def bot_on(
    fake: FakeDiscord, data_dir: Path, llm: Any, **settings: Any
) -> AsyncIterator[tuple[Runtime, DiscordAdapter]]:
    """The bot connected to `fake`, its state in `data_dir`: opened again on the same
    two, it is the same bot after a restart."""
    values = make_settings(
        data_dir,
        DISCORD_TOKEN="test-token",
        DISCORD_API_BASE_URL=fake.api_base,
        DISCORD_GATEWAY_URL=fake.gateway_url,
        **settings,
    )
    async with (
        open_runtime(values, llm=llm) as runtime,
        running(runtime, values, ready_within=WAIT) as adapter,
    ):
        yield runtime, adapter


async def slash(
    fake: FakeDiscord,
    guild: FakeGuild,
    user: FakeUser,
    name: str,
    permissions: int = 0,
    *,
    channel: FakeChannel | None = None,
    options: Sequence[dict[str, Any]] = (),
) -> tuple[str, bool]:
    """/sonality <name> in `channel` (the guild's first by default): the answer's text,
    and whether only the caller sees it."""
    _, token = await fake.interaction_create(
        guild=guild,
        channel=channel or guild.channels[0],
        user=user,
        subcommand=name,
        options=list(options),
        permissions=permissions,
    )
    base = f"/webhooks/{fake.application_id}/{token}"
    [answer] = await fake.wait_for(
        lambda r: (
            (r.method == "PATCH" and r.path == f"{base}/messages/@original")
            or (r.method == "POST" and r.path == base)
        ),
        seconds=WAIT,
    )
    private = answer.method == "POST" and bool(int(answer.json.get("flags", 0)) & 64)
    return str(answer.json["content"]), private
