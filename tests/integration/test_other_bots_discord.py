"""Other bots on Discord, end to end: real discord.py ↔ fake Discord, the real runtime ↔
fake Anthropic. A listed bot that pings the bot is answered at most three times in a
row in a channel, until a person writes there; an unlisted bot, or one that does not
really ping, never (and costs no model call); what a bot argues moves no belief; and the
bot's own replies ping nobody, so neither it nor the other bot is set off by them."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import discord

from tests.fakes.anthropic_server import AnthropicFake
from tests.fakes.discord_fixtures import (
    restores_discord_endpoints,  # noqa: F401
)
from tests.fakes.discord_server import FakeChannel, FakeDiscord, FakeUser
from tests.integration.conftest import (
    chat_requests,
    ess_requests,
    eventually,
    prompt_of,
)
from tests.integration.discord_guild import bot_on
from tests.integration.test_channel_modes_platforms import answered, replies
from tests.integration.test_channel_modes_platforms import settle as settle_runtime
from tests.integration.test_discord_e2e import (
    NO_PINGS,
    WAIT,
    World,
    delivered_to,
    discord_world,
    is_reply_post,
    mention,
    replies_to,
    settle,
)
from tests.integration.test_isolation_and_commands import CANARY, CANARY_TEXT

HELPER = FakeUser(7001, "helper", "Helper", bot=True)
STRANGER = FakeUser(7002, "stranger", "Stranger", bot=True)


@contextlib.asynccontextmanager
async def bots_world(
    tmp_path: Path, llm: Any, anthropic: AnthropicFake, **settings: Any
) -> AsyncIterator[World]:
    """Guild A with two channels, a member and two other bots; HELPER is listed in
    SONALITY_ANSWER_BOTS, and so is the bot's own id (it must still never answer itself).
    `settings` are added to the bot's."""
    fake = FakeDiscord()
    answer = f"{HELPER.id},{fake.bot.id}"
    async with discord_world(
        tmp_path,
        llm,
        anthropic,
        fake=fake,
        others=[HELPER, STRANGER],
        channels=2,
        SONALITY_ANSWER_BOTS=answer,
        **settings,
    ) as world:
        yield world


async def arrived(world: World, message: dict[str, Any]) -> None:
    """Until discord.py has `message` and the adapter is done with it (for a message
    that gets no answer there is no request to wait for)."""
    client = world.adapter.client
    assert client is not None
    wanted = int(message["id"])
    assert await eventually(lambda: any(m.id == wanted for m in client.cached_messages), WAIT)
    await settle(world)


async def from_bot(
    world: World,
    text: str,
    *,
    bot: FakeUser = HELPER,
    channel: int = 0,
    ping: bool = True,
    answered: bool = True,
) -> dict[str, Any]:
    """`bot` writes to the bot (pinging it unless `ping` is off); waits for the answer,
    or, with `answered` off, until the adapter has dealt with the message."""
    fake = world.fake
    trigger = await fake.message_create(
        channel=world.guild_a.channels[channel],
        author=bot,
        content=f"<@{fake.bot.id}> {text}",
        mentions=[fake.bot] if ping else [],
    )
    if answered:
        await fake.wait_for(lambda r: is_reply_post(r, trigger), seconds=WAIT)
    await arrived(world, trigger)
    return trigger


async def test_a_listed_bot_is_answered_three_times_in_a_row_until_a_person_writes(
    tmp_path: Path, llm: Any, anthropic_server: AnthropicFake
) -> None:
    async with bots_world(tmp_path, llm, anthropic_server) as world:
        for i in range(3):
            trigger = await from_bot(world, f"round {i}")
            assert all(p.json["allowed_mentions"] == NO_PINGS for p in replies_to(world, trigger))
            [shown] = delivered_to(world, trigger)
            assert shown["content"] == f"[reply] round {i}"
        calls = len(anthropic_server.requests)
        fourth = await from_bot(world, "round 3", answered=False)
        assert replies_to(world, fourth) == []
        assert len(anthropic_server.requests) == calls  # no model call either
        # The other channel has a count of its own.
        await from_bot(world, "over here", channel=1)

        # A member writes in the channel, to nobody in particular: the bots' run ends.
        said = await world.fake.message_create(
            channel=world.guild_a.channels[0], author=world.member, content="morning all"
        )
        await arrived(world, said)
        assert await world.runtime.db.bot_reply_counts() == {
            (f"discord:{world.guild_a.id}", str(world.guild_a.channels[1].id)): 1
        }
        for i in range(3):
            await from_bot(world, f"again {i}")
        await from_bot(world, "too many", answered=False)
        # A member talking to the bot resets it too.
        await mention(world, world.guild_a, "hello")
        await from_bot(world, "and now")


async def test_an_unlisted_bot_or_one_that_does_not_ping_is_never_answered(
    tmp_path: Path, llm: Any, anthropic_server: AnthropicFake
) -> None:
    # With the Message Content intent the bot reads messages that do not ping it too.
    intent = {"DISCORD_MESSAGE_CONTENT_INTENT": True}
    async with bots_world(tmp_path, llm, anthropic_server, **intent) as world:
        stranger = await from_bot(world, "hello?", bot=STRANGER, answered=False)
        # HELPER is listed, but its message names the bot without pinging it, and its
        # reply to the bot's message has the ping switched off.
        quiet = await from_bot(world, "hello?", ping=False, answered=False)
        answered = await from_bot(world, "hello")
        [ours] = delivered_to(world, answered)
        calls = len(anthropic_server.requests)
        unpinged = await world.fake.message_create(
            channel=world.guild_a.channels[0],
            author=HELPER,
            content="thanks!",
            reply_to=ours,
            ping=False,
        )
        await arrived(world, unpinged)
        assert replies_to(world, stranger) == replies_to(world, quiet) == []
        assert replies_to(world, unpinged) == []
        assert len(anthropic_server.requests) == calls
        assert len(chat_requests(anthropic_server)) == 1
        # The checks above can fail: the same reply with its ping is answered.
        pinged = await world.fake.message_create(
            channel=world.guild_a.channels[0], author=HELPER, content="thanks!", reply_to=ours
        )
        await world.fake.wait_for(lambda r: is_reply_post(r, pinged), seconds=WAIT)


async def test_a_bots_strong_argument_moves_no_belief(
    tmp_path: Path, llm: Any, anthropic_server: AnthropicFake
) -> None:
    anthropic_server.brain.ess_rule(**CANARY)
    async with bots_world(tmp_path, llm, anthropic_server) as world:
        await mention(world, world.guild_a, "hello")
        agent = world.agent(world.guild_a)
        store = world.runtime.db.community(f"discord:{world.guild_a.id}")
        before = agent.sponge.model_dump()
        evidence = await store.evidence()
        ess_calls = len(ess_requests(anthropic_server))
        for _ in range(3):
            await from_bot(world, CANARY_TEXT)
        assert "Helper (a bot)" in prompt_of(chat_requests(anthropic_server)[-1])
        assert len(ess_requests(anthropic_server)) == ess_calls
        assert agent.sponge.model_dump() == before
        assert await store.evidence() == evidence
        assert await store.pending_interactions() == []

        # The same argument from a member is judged and learned.
        await mention(world, world.guild_a, CANARY_TEXT)
        assert len(ess_requests(anthropic_server)) == ess_calls + 1
        assert agent.sponge.version == before["version"] + 1


async def test_the_bots_own_reply_pings_nobody_and_sets_nothing_off(
    tmp_path: Path, llm: Any, anthropic_server: AnthropicFake
) -> None:
    async with bots_world(tmp_path, llm, anthropic_server) as world:
        fake = world.fake
        anthropic_server.brain.reply_rule(
            contains="introduce yourself", text=f"Nice to meet you, <@{HELPER.id}>!"
        )
        trigger = await from_bot(world, "introduce yourself")
        posts = replies_to(world, trigger)
        assert posts and all(p.json["allowed_mentions"] == NO_PINGS for p in posts)
        [reply] = delivered_to(world, trigger)
        assert f"<@{HELPER.id}>" in reply["content"]
        # Discord pinged nobody: not the bot it names, not the bot it replies to.
        assert reply["mentions"] == []
        # The reply came back to the bot (Discord sends a bot its own messages), and it
        # answered nothing, even with its own id in SONALITY_ANSWER_BOTS.
        await arrived(world, reply)
        calls, sent = len(anthropic_server.requests), len(fake.find("POST", "/messages"))
        await asyncio.sleep(0.2)
        await settle(world)
        assert len(anthropic_server.requests) == calls
        assert len(fake.find("POST", "/messages")) == sent

        # The checks above can fail: a message that allows pings pings HELPER; and one
        # that pings the bot itself is still not answered (its own id is listed).
        client = world.adapter.client
        assert client is not None
        channel = client.get_channel(world.guild_a.channels[0].id)
        assert isinstance(channel, discord.TextChannel)
        loud = await channel.send(
            f"<@{HELPER.id}> <@{fake.bot.id}> what do you think?",
            allowed_mentions=discord.AllowedMentions.all(),
            reference=discord.MessageReference(
                message_id=int(trigger["id"]), channel_id=channel.id
            ),
        )
        pinged = [m["id"] for m in fake.messages[loud.id]["mentions"]]
        assert pinged == [str(HELPER.id), str(fake.bot.id)]
        await arrived(world, fake.messages[loud.id])
        assert len(anthropic_server.requests) == calls


async def test_a_thread_counts_with_its_channel(
    tmp_path: Path, llm: Any, anthropic_server: AnthropicFake
) -> None:
    """Two bots cannot go on by moving into a thread: replies there count with the
    channel's (SONALITY_BOT_EXCHANGES=2: one in the channel, one in its thread)."""
    fake = FakeDiscord()
    guild = fake.add_guild("Guild A", members=[HELPER])
    parent = guild.channels[0]
    thread = fake.add_thread(guild, parent)
    await fake.start()
    try:
        async with bot_on(
            fake,
            tmp_path / "data",
            llm,
            SONALITY_ANSWER_BOTS=str(HELPER.id),
            SONALITY_BOT_EXCHANGES=2,
        ) as (runtime, adapter):

            async def ping(where: FakeChannel, text: str) -> dict[str, Any]:
                return await fake.message_create(
                    channel=where,
                    author=HELPER,
                    content=f"<@{fake.bot.id}> {text}",
                    mentions=[fake.bot],
                )

            for where, text in ((parent, "in the channel"), (thread, "in its thread")):
                await answered(fake, await ping(where, text))
            calls = len(anthropic_server.requests)
            third = await ping(thread, "once more in the thread")
            client = adapter.client
            assert client is not None
            wanted = int(third["id"])
            assert await eventually(
                lambda: any(m.id == wanted for m in client.cached_messages), WAIT
            )
            await settle_runtime(runtime)
            assert replies(fake, third) == []
            assert len(anthropic_server.requests) == calls
            assert await runtime.db.bot_reply_counts() == {
                (f"discord:{guild.id}", str(parent.id)): 2
            }
    finally:
        await fake.close()
