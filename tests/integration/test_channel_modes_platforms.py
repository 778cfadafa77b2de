"""Channel modes through the platforms (issue 25, item 1, "What it must show").

Real discord.py against the fake Discord (which blanks a message's text for a session
without the Message Content intent unless it mentions the bot, as Discord does), and
real Bolt against the fake Slack; the real runtime on a data directory, its LLM the real
anthropic SDK against the loopback model server, which records every request. Nothing
is mocked.

- Discord: a `free` channel answered without a mention (with the intent), and paced;
  an `off` channel silent with no LLM request; the modes kept across a restart;
  `free` refused without the intent.
- Slack: a `free` channel answered from a `message.channels` event; an app without
  the channel history scopes refuses `free`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from adapters.discord import FREE_NEEDS_INTENT
from adapters.slack import FREE_NEEDS_SCOPES
from bot.runtime import Runtime
from providers.anthropic import AnthropicLLM
from storage.channels import ChannelMode
from tests.fakes.anthropic_server import AnthropicFake
from tests.fakes.discord_fixtures import (
    MANAGE_GUILD,
    SEND_MESSAGES,
    restores_discord_endpoints,  # noqa: F401
)
from tests.fakes.discord_server import FakeChannel, FakeDiscord, FakeGuild, FakeUser
from tests.fakes.images import picture
from tests.fakes.slack_server import OLD_MANIFEST_SCOPES, FakeSlack
from tests.integration.conftest import chat_requests, prompt_of
from tests.integration.discord_guild import bot_on, slash
from tests.integration.test_channel_modes import asked
from tests.integration.test_discord_e2e import HANDLER_TASKS, WAIT
from tests.integration.test_slack_e2e import SlackBot, slack_bot, slack_settings
from tests.slack.conftest import (  # noqa: F401  (fixtures "fake", "http")
    channel_message_event,
    fake_slack,
    http_session,
    mention_event,
)

MEMBER = FakeUser(9001, "alice", "Alice")
MOD = FakeUser(9002, "mod", "Mo")


# --------------------------------------------------------------------------- Discord


@contextlib.asynccontextmanager
async def discord_server() -> AsyncIterator[tuple[FakeDiscord, FakeGuild]]:
    fake = FakeDiscord()
    guild = fake.add_guild("Guild A", channels=3, members=[MEMBER, MOD])
    await fake.start()
    try:
        yield fake, guild
    finally:
        await fake.close()


@contextlib.asynccontextmanager
async def discord_bot(
    fake: FakeDiscord, data_dir: Path, llm: AnthropicLLM, **settings: Any
) -> AsyncIterator[Runtime]:
    """The bot on `fake`, keeping its state in `data_dir` (the same one is a restart)."""
    async with bot_on(fake, data_dir, llm, **settings) as (runtime, _):
        yield runtime


async def settle(runtime: Runtime) -> None:
    """Until discord.py's handler tasks are done and learning has finished (call it
    after a barrier was answered: before an event reaches discord.py, no task waits)."""
    me = asyncio.current_task()
    async with asyncio.timeout(WAIT):
        while busy := [
            t
            for t in asyncio.all_tasks()
            if t is not me and not t.done() and t.get_name() in HANDLER_TASKS
        ]:
            await asyncio.wait(busy)
    await runtime.drain()


async def channel_command(
    fake: FakeDiscord,
    guild: FakeGuild,
    where: FakeChannel,
    *mode: str,
    user: FakeUser = MOD,
    permissions: int = MANAGE_GUILD,
) -> str:
    """/sonality channel [mode] in `where`; the answer's text (public or private)."""
    options = [{"name": "mode", "type": 3, "value": m} for m in mode]
    text, _ = await slash(fake, guild, user, "channel", permissions, channel=where, options=options)
    return text


async def say(
    fake: FakeDiscord, where: FakeChannel, text: str, *, mention: bool = False
) -> dict[str, Any]:
    content = f"<@{fake.bot.id}> {text}" if mention else text
    return await fake.message_create(
        channel=where, author=MEMBER, content=content, mentions=[fake.bot] if mention else []
    )


def replies(fake: FakeDiscord, trigger: dict[str, Any]) -> list[Any]:
    """The bot's message POSTs that answer `trigger`."""
    return [
        r
        for r in fake.requests
        if r.method == "POST"
        and r.path == f"/channels/{trigger['channel_id']}/messages"
        and str(((r.json or {}).get("message_reference") or {}).get("message_id")) == trigger["id"]
    ]


async def answered(fake: FakeDiscord, trigger: dict[str, Any]) -> None:
    await fake.wait_for(lambda r: r in replies(fake, trigger), seconds=WAIT)


def typing_in(fake: FakeDiscord, where: FakeChannel) -> int:
    return len(fake.find("POST", f"/channels/{where.id}/typing"))


async def test_discord_free_channel_is_answered_without_a_mention_and_paced(
    tmp_path: Path, llm: AnthropicLLM, anthropic_server: AnthropicFake
) -> None:
    async with (
        discord_server() as (fake, guild),
        discord_bot(
            fake,
            tmp_path / "data",
            llm,
            DISCORD_MESSAGE_CONTENT_INTENT=True,
            SONALITY_FREE_CHANNEL_SECONDS=3600,
        ) as runtime,
    ):
        free, other, _ = guild.channels
        said = await channel_command(fake, guild, free, "free")
        assert said.startswith("This channel is now `free`: I answer every member's message")

        first = await say(fake, free, "Tea beats coffee for focus, says a 2021 trial.")
        await answered(fake, first)
        # Two more unprompted messages inside the hour: neither is answered, and a
        # mention after them still is (the barrier: everything before it was handled).
        second = await say(fake, free, "Second unprompted remark.")
        third = await say(fake, free, "Third unprompted remark.")
        chatter = await say(fake, other, "Chatter in a mention channel.")
        mention = await say(fake, free, "what do you say?", mention=True)
        await answered(fake, mention)
        await settle(runtime)

        assert len(replies(fake, first)) == 1 and len(replies(fake, mention)) == 1
        assert replies(fake, second) == replies(fake, third) == replies(fake, chatter) == []
        # Discord sent the text (the intent), the model saw it, and nothing of the rest.
        assert any("Tea beats coffee" in prompt_of(r) for r in chat_requests(anthropic_server))
        assert asked(anthropic_server, "Second unprompted") == 0
        assert asked(anthropic_server, "Third unprompted") == 0
        assert asked(anthropic_server, "Chatter in a mention channel") == 0
        # It showed it was working only for the two it answered.
        assert typing_in(fake, free) == 2 and typing_in(fake, other) == 0
        # It learned from what it answered, as from any answer.
        rows = await runtime.db.member_rows(f"discord:{guild.id}", str(MEMBER.id))
        assert [m.message for m in rows.messages] == [
            "Tea beats coffee for focus, says a 2021 trial.",
            "what do you say?",
        ]
        assert len(rows.evidence) == 2


async def test_discord_free_channel_fetches_no_picture_of_an_unprompted_message(
    tmp_path: Path, llm: AnthropicLLM, anthropic_server: AnthropicFake
) -> None:
    """An unprompted answer reads the words: no picture is downloaded for a message the
    bot might not answer. A mention's picture is (the fake's CDN counts both)."""
    async with (
        discord_server() as (fake, guild),
        discord_bot(fake, tmp_path / "data", llm, DISCORD_MESSAGE_CONTENT_INTENT=True) as runtime,
    ):
        free = guild.channels[0]
        await channel_command(fake, guild, free, "free")
        unprompted = await fake.message_create(
            channel=free,
            author=MEMBER,
            content="Look at this chart of rents.",
            attachments=[fake.attachment(free, "rents.png", picture("image/png"))],
        )
        await answered(fake, unprompted)
        await settle(runtime)
        assert fake.cdn_requests == []
        assert any("Look at this chart" in prompt_of(r) for r in chat_requests(anthropic_server))

        mention = await fake.message_create(
            channel=free,
            author=MEMBER,
            content=f"<@{fake.bot.id}> and this one?",
            mentions=[fake.bot],
            attachments=[fake.attachment(free, "more.png", picture("image/png"))],
        )
        await answered(fake, mention)
        await settle(runtime)
        assert len(fake.cdn_requests) == 1


async def test_discord_off_channel_fetches_no_picture_of_a_mention(
    tmp_path: Path, llm: AnthropicLLM, anthropic_server: AnthropicFake
) -> None:
    """A mention with four pictures in an `off` channel: the runtime answers nothing
    there, so nothing is downloaded either (4 x 3.75 MB a message, before)."""
    async with (
        discord_server() as (fake, guild),
        discord_bot(fake, tmp_path / "data", llm) as runtime,
    ):
        off, plain = guild.channels[1], guild.channels[2]
        assert "now `off`" in await channel_command(fake, guild, off, "off")
        await fake.message_create(
            channel=off,
            author=MEMBER,
            content=f"<@{fake.bot.id}> look at zanzibarquill",
            mentions=[fake.bot],
            attachments=[fake.attachment(off, f"p{i}.png", picture("image/png")) for i in range(4)],
        )
        barrier = await say(fake, plain, "barrier", mention=True)
        await answered(fake, barrier)
        await settle(runtime)
        assert asked(anthropic_server, "zanzibarquill") == 0
        assert fake.cdn_requests == []


async def test_discord_off_channel_is_silent_with_no_llm_request_and_modes_survive_a_restart(
    tmp_path: Path, llm: AnthropicLLM, anthropic_server: AnthropicFake
) -> None:
    data = tmp_path / "data"
    async with discord_server() as (fake, guild):
        free, off, plain = guild.channels
        async with discord_bot(fake, data, llm, DISCORD_MESSAGE_CONTENT_INTENT=True):
            assert "now `off`" in await channel_command(fake, guild, off, "off")
            assert "now `free`" in await channel_command(fake, guild, free, "free")

        # A restart: a new runtime and adapter on the same data directory.
        async with discord_bot(fake, data, llm, DISCORD_MESSAGE_CONTENT_INTENT=True) as runtime:
            before = len(anthropic_server.requests)
            silent = await say(fake, off, "are you there, bot?", mention=True)
            unprompted = await say(fake, free, "Nobody mentioned the bot here.")
            await answered(fake, unprompted)
            barrier = await say(fake, plain, "and here?", mention=True)
            await answered(fake, barrier)
            await settle(runtime)

            assert replies(fake, silent) == [] and typing_in(fake, off) == 0
            assert not fake.find("POST", f"/channels/{off.id}/messages")
            assert asked(anthropic_server, "are you there, bot?") == 0
            # Only the two answered messages asked for a reply; nothing the model was
            # asked (replies, ratings) held the `off` channel's message.
            after = anthropic_server.requests[before:]
            replied = [r for r in after if "<personality_state>" in r.system_text]
            assert len(replied) == 2
            assert all("are you there" not in prompt_of(r) for r in after)

            # Commands still work in the `off` channel: a member sees how many channels
            # are set apart, a moderator (Manage Server) which.
            looked = await channel_command(fake, guild, off, user=MEMBER, permissions=SEND_MESSAGES)
            assert looked.startswith("**Channel**\nThis channel: `off`: I answer nothing here")
            assert "2 channel(s) are set apart" in looked and free.name not in looked
            listed = await channel_command(fake, guild, off)
            assert f"#{free.name} ({free.id}): `free`" in listed
            assert f"#{off.name} ({off.id}): `off`" in listed


async def test_discord_free_is_refused_without_the_intent(
    tmp_path: Path, llm: AnthropicLLM, anthropic_server: AnthropicFake
) -> None:
    async with discord_server() as (fake, guild), discord_bot(fake, tmp_path / "data", llm) as rt:
        first = guild.channels[0]
        refused = await channel_command(fake, guild, first, "free")
        assert refused == FREE_NEEDS_INTENT and "\n" not in refused
        assert "DISCORD_MESSAGE_CONTENT_INTENT=true" in refused
        assert await rt.db.channel_settings(f"discord:{guild.id}") == []
        # `off` needs nothing of Discord, and works.
        assert "now `off`" in await channel_command(fake, guild, guild.channels[1], "off")
        [setting] = await rt.db.channel_settings(f"discord:{guild.id}")
        assert (setting.channel_id, setting.mode) == (str(guild.channels[1].id), ChannelMode.OFF)
        assert setting.channel_name == guild.channels[1].name


# --------------------------------------------------------------------------- Slack


async def test_slack_free_channel_is_answered_from_a_message_channels_event(
    tmp_path: Path,
    llm: AnthropicLLM,
    fake: FakeSlack,
    http: aiohttp.ClientSession,
    anthropic_server: AnthropicFake,
) -> None:
    # No pause between unprompted replies: the copy of a mention that arrives as a
    # channel message would be answered too, if the adapter let it through.
    settings = slack_settings(tmp_path / "data", fake, SONALITY_FREE_CHANNEL_SECONDS=0)
    async with slack_bot(settings, llm, fake, http) as bot:
        chatter = await deliver_message(bot, fake, "Chatter before the channel is free.")
        await fake.settle(quiet=0.2)
        assert not [p for p in fake.posts() if p.get("thread_ts") == chatter]
        assert not fake.calls("reactions.add")  # nothing shown for a message not answered

        answer = await bot.command("channel free", team="T1", user="UADMIN")
        assert answer["text"].startswith("This channel is now `free`")

        ts = await deliver_message(bot, fake, "Slack threads beat email for decisions.")
        await fake.wait_for(
            lambda: [p for p in fake.posts() if p.get("thread_ts") == ts], what="free reply"
        )
        # A mention comes both as app_mention and as a channel message: answered once.
        mention_ts = bot.next_ts()
        mentioned = "<@UBOT> what do you think?"
        both = channel_message_event(
            fake, event_id="EvBothM", ts=mention_ts, team="T1", text=mentioned
        )
        assert both is not None
        await bot.deliver(both)
        await bot.deliver(
            mention_event(event_id="EvBothA", ts=mention_ts, team="T1", text=mentioned)
        )
        await fake.wait_for(
            lambda: [p for p in fake.posts() if p.get("thread_ts") == mention_ts], what="mention"
        )
        await bot.runtime.drain()
        await fake.settle(quiet=0.2)

        assert len([p for p in fake.posts() if p.get("thread_ts") == ts]) == 1
        assert len([p for p in fake.posts() if p.get("thread_ts") == mention_ts]) == 1
        assert asked(anthropic_server, "Chatter before the channel is free") == 0
        assert any(
            "Slack threads beat email" in prompt_of(r) for r in chat_requests(anthropic_server)
        )
        reacted = {r.args["timestamp"] for r in fake.calls("reactions.add")}
        assert reacted == {ts, mention_ts}
        rows = await bot.runtime.db.member_rows("slack:T1", "U1")
        assert [m.message for m in rows.messages] == [
            "Slack threads beat email for decisions.",
            "what do you think?",
        ]


async def deliver_message(bot: SlackBot, fake: FakeSlack, text: str) -> str:
    """A member's message in channel C0001 that does not mention the bot; its ts."""
    ts = bot.next_ts()
    body = channel_message_event(fake, event_id=f"Ev{ts}", ts=ts, team="T1", text=text)
    assert body is not None, "the app holds channels:history: Slack sends the event"
    status, _ = await bot.deliver(body)
    assert status == 200
    return ts


async def test_slack_app_without_channel_history_refuses_free(
    tmp_path: Path,
    llm: AnthropicLLM,
    fake: FakeSlack,
    http: aiohttp.ClientSession,
) -> None:
    fake.default_identity.scopes = OLD_MANIFEST_SCOPES
    assert not fake.sends_channel_messages() and not fake.sends_channel_messages(private=True)
    async with slack_bot(slack_settings(tmp_path / "data", fake), llm, fake, http) as bot:
        refused = await bot.command("channel free", team="T1", user="UADMIN")
        assert refused["response_type"] == "ephemeral"
        assert refused["text"] == FREE_NEEDS_SCOPES
        assert await bot.runtime.db.channel_settings("slack:T1") == []
        assert (await bot.command("channel off", team="T1", user="UADMIN"))["text"].startswith(
            "This channel is now `off`"
        )


async def test_discord_a_mode_set_in_a_thread_is_its_channels(
    tmp_path: Path, llm: AnthropicLLM, anthropic_server: AnthropicFake
) -> None:
    async with discord_server() as (fake, guild):
        parent = guild.channels[0]
        thread = fake.add_thread(guild, parent)
        async with discord_bot(fake, tmp_path / "data", llm) as runtime:
            assert "now `off`" in await channel_command(fake, guild, thread, "off")
            [setting] = await runtime.db.channel_settings(f"discord:{guild.id}")
            assert (setting.channel_id, setting.channel_name) == (str(parent.id), parent.name)
            in_thread = await say(fake, thread, "anyone in this thread?", mention=True)
            barrier = await say(fake, guild.channels[1], "and here?", mention=True)
            await answered(fake, barrier)
            await settle(runtime)
            assert replies(fake, in_thread) == []
            assert asked(anthropic_server, "anyone in this thread?") == 0


async def test_discord_free_by_default_without_the_intent_hears_mentions_only(
    tmp_path: Path,
    llm: AnthropicLLM,
    anthropic_server: AnthropicFake,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Without the intent Discord sends a message that does not mention the bot without
    its text (the fake does as Discord does), so even a free channel hears mentions only,
    and the start says so."""
    caplog.set_level(logging.WARNING, logger="adapters.discord")
    async with (
        discord_server() as (fake, guild),
        discord_bot(fake, tmp_path / "data", llm, SONALITY_CHANNEL_MODE="free") as runtime,
    ):
        where = guild.channels[0]
        unheard = await say(fake, where, "Words Discord never sends to this bot.")
        mention = await say(fake, where, "can you hear this?", mention=True)
        await answered(fake, mention)
        await settle(runtime)
        assert replies(fake, unheard) == []
        assert asked(anthropic_server, "Words Discord never sends") == 0
    assert any("SONALITY_CHANNEL_MODE=free" in r.getMessage() for r in caplog.records)
