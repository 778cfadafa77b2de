"""A member's Discord display name in public command answers: answers are sent as
markdown, so a name must not be able to form a masked link there
(`adapters.sanitize.clean_name`)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from tests.fakes.anthropic_server import AnthropicFake
from tests.fakes.discord_fixtures import MANAGE_GUILD, restores_discord_endpoints  # noqa: F401
from tests.fakes.discord_server import FakeUser
from tests.integration.discord_guild import guild_bot, slash
from tests.integration.timeline_scenario import teach

LINK = "[Vote here](https://evil.example)"


async def test_a_display_name_shaped_as_a_link_shows_as_plain_words(
    tmp_path: Path, llm: Any, anthropic_server: AnthropicFake, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SONALITY_OPINION_COOLING_PERIOD", "0")
    teach(anthropic_server.brain)  # the remote work study below moves an opinion
    troll, other = FakeUser(9101, "troll", LINK), FakeUser(9102, "other", "Other_Name.x")
    async with guild_bot(tmp_path / "data", llm, [troll, other]) as bot:
        for author, text in (
            (troll, "A remote work study found output rose by 13%."),
            (other, "hello"),
        ):
            await bot.fake.message_create(
                channel=bot.guild.channels[0],
                author=author,
                content=f"<@{bot.fake.bot.id}> {text}",
                mentions=[bot.fake.bot],
            )
            await asyncio.sleep(0.5)
            await asyncio.wait_for(bot.runtime.drain(), 10)
        beliefs, private = await slash(bot.fake, bot.guild, other, "beliefs")
        assert not private
        assert "last moved by (Vote here)(https://evil.example)" in beliefs, beliefs
        usage, _ = await slash(bot.fake, bot.guild, other, "usage", MANAGE_GUILD)
        assert "(Vote here)(https://evil.exam" in usage, usage  # the members' list
        for answer in (beliefs, usage):
            assert "[" not in answer and "](" not in answer, answer
        names = await bot.runtime.db.speaker_names(
            f"discord:{bot.guild.id}", [str(troll.id), str(other.id)]
        )
        # Ordinary names (underscores, dots) are kept as they are.
        assert names == {
            str(troll.id): "(Vote here)(https://evil.example)",
            str(other.id): "Other_Name.x",
        }
