"""What Discord can deliver that the bot did not expect, through the real discord.py
against the fake Discord: every failed slash command is answered privately, a gateway
frame discord.py cannot decode costs that one event and not the connection, and names
and texts reach the runtime as valid, bounded text."""

from __future__ import annotations

import io
import json
import logging
from typing import Any

import discord
import discord.client
import discord.shard
import discord.utils
import pytest
from discord.gateway import DiscordWebSocket

from adapters.sanitize import MAX_COMMUNITY_NAME_CHARS, MAX_NAME_CHARS
from tests.adapters.test_discord import (
    callbacks,
    guild_and_channel,
    running,
    wait_sent,
)
from tests.fakes.discord_fixtures import (
    MANAGE_GUILD,
    is_ephemeral,
)
from tests.fakes.discord_server import FakeDiscord, FakeUser, RecordedRequest
from tests.fakes.recording_runtime import RecordingRuntime

LONE_SURROGATE = "\ud800"  # json.dumps writes it as the escape "\ud800"


async def answer_to(server: FakeDiscord, interaction_id: int) -> RecordedRequest:
    [callback] = await server.wait_for(lambda r: f"/interactions/{interaction_id}/" in r.path)
    return callback


# --------------------------------------------------------------------------- slash commands


@pytest.mark.parametrize(
    ("call", "expected"),
    [
        pytest.param(
            {"subcommand": "rollback", "options": []},
            "`/sonality rollback` arrived in an older shape",
            id="required-option-missing",
        ),
        pytest.param(
            {"subcommand": "diff", "options": [{"name": "a", "type": 4, "value": 1}]},
            "`/sonality diff` arrived in an older shape",
            id="one-of-two-required-options",
        ),
        pytest.param(
            {"subcommand": "frobnicate"},
            "I don't have `/sonality frobnicate`",
            id="unknown-subcommand",
        ),
        pytest.param(
            {"subcommand": "beliefs", "command": "sonality-old"},
            "I don't have `/sonality-old`",
            id="unknown-command",
        ),
    ],
)
async def test_a_stale_slash_command_gets_a_private_answer(
    fake: FakeDiscord,
    runtime: RecordingRuntime,
    alice: FakeUser,
    caplog: pytest.LogCaptureFixture,
    call: dict[str, Any],
    expected: str,
) -> None:
    guild, channel = guild_and_channel(fake)
    async with running(fake, runtime):
        iid, token = await fake.interaction_create(
            guild=guild, channel=channel, user=alice, permissions=MANAGE_GUILD, **call
        )
        callback = await answer_to(fake, iid)
    assert callback.path == f"/interactions/{iid}/{token}/callback"
    assert callback.json["type"] == 4  # a message now, not "thinking…"
    assert is_ephemeral(callback)
    assert expected in callback.json["data"]["content"]
    assert "/sonality help" in callback.json["data"]["content"]
    assert callback.json["data"]["allowed_mentions"] == {"parse": []}
    assert runtime.commands == []  # nothing ran
    [why] = [r for r in caplog.records if "slash command not run" in r.getMessage()]
    assert why.levelno == logging.WARNING and str(guild.id) in why.getMessage()


async def test_autocomplete_for_an_unknown_subcommand_gets_no_suggestions(
    fake: FakeDiscord,
    runtime: RecordingRuntime,
    alice: FakeUser,
) -> None:
    guild, channel = guild_and_channel(fake)
    async with running(fake, runtime):
        iid, _ = await fake.interaction_create(
            guild=guild,
            channel=channel,
            user=alice,
            subcommand="frobnicate",
            options=[{"name": "topic", "type": 3, "value": "x", "focused": True}],
            autocomplete=True,
        )
        callback = await answer_to(fake, iid)
        # The connection is still there: a real command after it runs.
        later, _ = await fake.interaction_create(
            guild=guild, channel=channel, user=alice, subcommand="status"
        )
        await fake.wait_for(lambda r: r.method == "PATCH")
    assert callback.json == {"type": 8, "data": {"choices": []}}
    assert [c.json["type"] for c in callbacks(fake, later)] == [5]
    assert [r.name for r in runtime.commands] == ["status"]


# --------------------------------------------------------------------------- gateway


async def test_an_undecodable_gateway_event_is_skipped_and_the_bot_stays_connected(
    fake: FakeDiscord,
    runtime: RecordingRuntime,
    alice: FakeUser,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """discord.py decodes with orjson, which refuses a lone surrogate escape; the event
    is logged and skipped, and the next message is answered on the same session."""
    _, channel = guild_and_channel(fake)
    mention = f"<@{fake.bot.id}>"
    async with running(fake, runtime):
        await fake.message_create(
            channel=channel,
            author=alice,
            content=f"{mention} broken {LONE_SURROGATE} text",
            mentions=[fake.bot],
        )
        await fake.message_create(
            channel=channel, author=alice, content=f"{mention} still there?", mentions=[fake.bot]
        )
        [sent] = await wait_sent(fake)
        assert discord.client.DiscordWebSocket is not DiscordWebSocket  # while running
    assert sent.json["content"] == "echo: still there?"
    assert [m.text for m in runtime.messages] == ["still there?"]
    assert len(fake.identifies) == 1, "the session was kept, not reconnected"
    [skipped] = [r for r in caplog.records if "could not be decoded" in r.getMessage()]
    assert skipped.levelno == logging.WARNING
    assert "MESSAGE_CREATE" in skipped.getMessage()
    assert "broken" not in skipped.getMessage(), "the log names the event, not its text"
    # discord.py's own class is back once the adapter closed.
    assert discord.client.DiscordWebSocket is DiscordWebSocket
    assert discord.shard.DiscordWebSocket is DiscordWebSocket


@pytest.mark.parametrize("broken", ["no-author", "null-author", "no-id", "update-no-channel"])
async def test_an_event_discord_py_cannot_read_is_skipped_and_the_bot_stays_connected(
    fake: FakeDiscord,
    runtime: RecordingRuntime,
    alice: FakeUser,
    caplog: pytest.LogCaptureFixture,
    broken: str,
) -> None:
    """A field missing or null: discord.py's parser, which runs inline, raises a
    KeyError or TypeError that would end the client (and the process). The event is
    logged and skipped; the next message is answered on the same session."""
    _, channel = guild_and_channel(fake)
    mention = f"<@{fake.bot.id}>"
    async with running(fake, runtime):
        bad = fake.message_payload(
            channel_id=channel.id,
            author=alice,
            content=f"{mention} quillfeather",
            mentions=[fake.bot],
            reply_to=None,
            ping=True,
            attachments=None,
        )
        event = "MESSAGE_CREATE"
        if broken == "no-author":
            del bad["author"]
        elif broken == "null-author":
            bad["author"] = None
        elif broken == "no-id":
            del bad["id"]
        else:
            event = "MESSAGE_UPDATE"
            del bad["channel_id"]
        await fake.dispatch(event, bad, guild_id=fake.guilds[0].id)
        await fake.message_create(
            channel=channel, author=alice, content=f"{mention} still there?", mentions=[fake.bot]
        )
        [sent] = await wait_sent(fake)
    assert sent.json["content"] == "echo: still there?"
    assert [m.text for m in runtime.messages] == ["still there?"]
    assert len(fake.identifies) == 1, "the session was kept, not reconnected"
    [skipped] = [r for r in caplog.records if "could not read" in r.getMessage()]
    assert skipped.levelno == logging.WARNING and event in skipped.getMessage()
    assert "quillfeather" not in skipped.getMessage(), "the log names the event, not its text"


async def test_without_orjson_bad_text_and_long_names_are_cleaned_at_the_edge(
    fake: FakeDiscord,
    runtime: RecordingRuntime,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """discord.py without orjson decodes with the standard library, which lets a lone
    surrogate through: the adapter replaces it, drops control characters and cuts names,
    so the runtime (and SQLite and the LLM request behind it) gets valid text."""
    monkeypatch.setattr(discord.utils, "_from_json", json.loads)
    eve = FakeUser(9005, "eve", f"Eve{LONE_SURROGATE}\x07" + "e" * 200)
    guild = fake.add_guild("Guild\u202e " + "g" * 300, members=[eve])
    channel = guild.channels[0]
    async with running(fake, runtime):
        await fake.message_create(
            channel=channel,
            author=eve,
            content=f"<@{fake.bot.id}> one {LONE_SURROGATE} two\r\nthree\x00",
            mentions=[fake.bot],
        )
        [sent] = await wait_sent(fake)
        await fake.interaction_create(
            guild=guild,
            channel=channel,
            user=eve,
            subcommand="beliefs",
            options=[{"name": "topic", "type": 3, "value": f"x{LONE_SURROGATE}" * 900}],
        )
        await fake.wait_for(lambda r: r.method == "PATCH")
    [message] = runtime.messages
    assert message.text == "one \ufffd two\nthree"
    assert sent.json["content"] == "echo: one \ufffd two\nthree"
    assert message.user.name == ("Eve\ufffd" + "e" * 200)[:MAX_NAME_CHARS]
    assert message.community.name == ("Guild " + "g" * 300)[:MAX_COMMUNITY_NAME_CHARS]
    [request] = runtime.commands
    assert request.caller.name == message.user.name
    [topic] = request.args
    assert len(topic) == 1000 and set(topic) == {"x", "\ufffd"}
    for text in (message.text, message.user.name, message.community.name, topic):
        text.encode("utf-8")  # raises on a lone surrogate


# --------------------------------------------------------------------------- the fake's rules


async def test_the_fake_refuses_an_empty_message_as_discord_does(
    fake: FakeDiscord, runtime: RecordingRuntime
) -> None:
    """Discord answers 50006 to a message of no text (blanks are none) and nothing else,
    sent or edited to be one; the fake does too, so a bot that sent one would fail here."""
    _, channel = guild_and_channel(fake)
    async with running(fake, runtime) as adapter:
        assert adapter.client is not None
        target = adapter.client.get_channel(channel.id)
        assert isinstance(target, discord.TextChannel)
        for blank in ("", " \n "):
            with pytest.raises(discord.HTTPException) as refused:
                await target.send(blank)
            assert (refused.value.status, refused.value.code) == (400, 50006)
        sent = await target.send("words")
        with pytest.raises(discord.HTTPException) as refused:
            await sent.edit(content="  ")
        assert refused.value.code == 50006
        await target.send(file=discord.File(io.BytesIO(b"data"), "notes.txt"))  # a file alone
