"""The Message Content intent is opt-in: without it the bot answers what Discord still
sends with text (@mentions, replies that ping it, DMs). The fake Discord blanks every
other message for a session without the intent, and refuses the intent when the
portal switch is off, as Discord does."""

from __future__ import annotations

import asyncio
import logging

import pytest

from adapters.discord import INTENTS_HELP, DiscordAdapter
from bot.interface import StartupError
from tests.adapters.test_discord import (
    guild_and_channel,
    make_settings,
    running,
    wait_sent,
)
from tests.fakes.discord_server import FakeDiscord, FakeUser
from tests.fakes.recording_runtime import RecordingRuntime


async def test_without_the_intent_a_reply_that_does_not_ping_is_skipped(
    fake: FakeDiscord,
    runtime: RecordingRuntime,
    alice: FakeUser,
    caplog: pytest.LogCaptureFixture,
) -> None:
    fake.message_content_allowed = False  # the portal switch is off: nothing asks for it
    _, channel = guild_and_channel(fake)
    caplog.set_level(logging.INFO, logger="adapters.discord")
    async with running(fake, runtime):
        bot_said = fake.message_payload(channel_id=channel.id, author=fake.bot, content="Hm.")
        await fake.message_create(
            channel=channel, author=alice, content="quiet reply", reply_to=bot_said, ping=False
        )
        await fake.message_create(
            channel=channel, author=alice, content="loud reply", reply_to=bot_said
        )
        mention = f"<@{fake.bot.id}>"
        await fake.message_create(
            channel=channel, author=alice, content=f"{mention} hello", mentions=[fake.bot]
        )
        await wait_sent(fake, count=2)  # the barrier: both later messages were answered
    assert [m.text for m in runtime.messages] == ["loud reply", "hello"]
    assert any("without the Message Content intent" in r.getMessage() for r in caplog.records)


async def test_with_the_intent_a_reply_without_a_ping_is_answered(
    fake: FakeDiscord,
    runtime: RecordingRuntime,
    alice: FakeUser,
) -> None:
    _, channel = guild_and_channel(fake)
    async with running(fake, runtime, discord_message_content=True):
        bot_said = fake.message_payload(channel_id=channel.id, author=fake.bot, content="Hm.")
        await fake.message_create(
            channel=channel, author=alice, content="quiet reply", reply_to=bot_said, ping=False
        )
        await wait_sent(fake)
    assert [m.text for m in runtime.messages] == ["quiet reply"]
    assert fake.identifies[0]["intents"] & (1 << 15)


async def test_asking_for_the_intent_the_portal_has_off_is_one_clear_line(
    fake: FakeDiscord,
    runtime: RecordingRuntime,
) -> None:
    fake.message_content_allowed = False
    settings = make_settings(fake, discord_message_content=True)
    adapter = DiscordAdapter(runtime, settings, identify_delay=0)
    with pytest.raises(StartupError) as info:
        await asyncio.wait_for(adapter.start(), 10)
    assert str(info.value) == INTENTS_HELP
    assert "DISCORD_MESSAGE_CONTENT_INTENT" in INTENTS_HELP and "\n" not in INTENTS_HELP
