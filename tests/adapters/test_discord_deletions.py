"""Deletions and edits as discord.py delivers them to the adapter (issue 25, item 4): the
real client against the fake Discord's MESSAGE_DELETE, MESSAGE_DELETE_BULK and
MESSAGE_UPDATE, with a recording runtime (what the runtime then does is
tests/integration/test_deletion_discord.py's).
"""

from __future__ import annotations

from tests.adapters.test_discord import (
    guild_and_channel,
    running,
    wait_sent,
)
from tests.fakes.discord_server import FakeChannel, FakeDiscord, FakeUser
from tests.fakes.recording_runtime import RecordingRuntime


async def barrier(fake: FakeDiscord, author: FakeUser, count: int) -> None:
    """A later guild message is answered: every gateway event before it was handled."""
    _, channel = guild_and_channel(fake)
    await fake.message_create(
        channel=channel, author=author, content=f"<@{fake.bot.id}> barrier", mentions=[fake.bot]
    )
    await wait_sent(fake, count=count)


async def test_deletions_name_the_server_or_the_dm_they_happened_in(
    fake: FakeDiscord,
    runtime: RecordingRuntime,
    alice: FakeUser,
) -> None:
    guild, channel = guild_and_channel(fake)
    dm = FakeChannel(fake.snowflake(), "dm")
    async with running(fake, runtime, discord_allow_dms=True):
        said = await fake.message_create(
            channel=channel, author=alice, content=f"<@{fake.bot.id}> hi", mentions=[fake.bot]
        )
        await wait_sent(fake)
        private = fake.message_payload(channel_id=dm.id, author=alice, content="psst")
        await fake.dispatch("MESSAGE_CREATE", private)
        await wait_sent(fake, count=2)
        other = await fake.message_create(channel=channel, author=alice, content="no ping")
        await fake.message_delete(said)
        await fake.message_delete(private)  # cached by discord.py: its author is known
        await fake.message_delete_bulk([other])
        await barrier(fake, alice, 3)
    assert sorted(runtime.deleted) == sorted(
        [
            ("discord", said["id"], f"discord:{guild.id}"),
            ("discord", private["id"], f"discord:dm:{alice.id}"),
            ("discord", other["id"], f"discord:{guild.id}"),
        ]
    )


async def test_an_edit_is_handed_over_with_its_new_words_and_answered_again(
    fake: FakeDiscord,
    runtime: RecordingRuntime,
    alice: FakeUser,
) -> None:
    _, channel = guild_and_channel(fake)
    bot = fake.bot
    async with running(fake, runtime):
        said = await fake.message_create(
            channel=channel, author=alice, content=f"<@{bot.id}> first words", mentions=[bot]
        )
        await wait_sent(fake)
        await fake.message_preview(said)  # no edit: a link preview arrived
        # The bot's own messages are edited while it streams: never handed over.
        [reply] = [m for m in fake.messages.values() if m["author"]["id"] == str(bot.id)]
        await fake.message_edit(reply, "the bot's own edit")
        await fake.message_edit(said, f"<@{bot.id}> second words", mentions=[bot])
        await wait_sent(fake, count=2)
        await fake.message_edit(said, "no longer for the bot")
        await barrier(fake, alice, 3)
    assert runtime.edited == [
        ("discord", said["id"], "second words"),
        ("discord", said["id"], None),  # without the Message Content intent: no text
    ]
    assert [m.text for m in runtime.messages] == ["first words", "second words", "barrier"]
    assert {m.message_id for m in runtime.messages[:2]} == {said["id"]}


async def test_an_update_of_an_edited_message_with_the_same_content_is_no_edit(
    fake: FakeDiscord,
    runtime: RecordingRuntime,
    alice: FakeUser,
) -> None:
    """Once edited, every later update of a message (a link preview) keeps its edited
    timestamp. Its mention of Bob would render under his new name now: the content
    Discord holds is unchanged since the copy discord.py cached, so it is no edit."""
    _, channel = guild_and_channel(fake)
    bot, bob = fake.bot, FakeUser(9002, "bob", "Bob")
    async with running(fake, runtime):
        said = await fake.message_create(
            channel=channel, author=alice, content=f"<@{bot.id}> hi", mentions=[bot]
        )
        await wait_sent(fake)
        edited = await fake.message_edit(
            said, f"<@{bot.id}> what does <@{bob.id}> say?", mentions=[bot, bob]
        )
        await wait_sent(fake, count=2)
        edited["mentions"][1]["global_name"] = "Robert"  # Bob renamed himself since
        await fake.message_preview(said)
        await barrier(fake, alice, 3)
    assert [text for _, _, text in runtime.edited] == ["what does @Bob say?"]
