"""The real discord.py client, driven by DiscordAdapter, against a fake Discord.

Nothing in discord.py is mocked: the adapter only points Route.BASE and the gateway
URL at tests/fakes/discord_server.py, so every assertion is about what discord.py
really sent over HTTP and the websocket. The runtime is a small recording
implementation of our own ChatRuntime protocol.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import pytest

from adapters.discord import INTENTS_HELP, TOKEN_HELP, DiscordAdapter
from bot.command_table import COMMAND_NAMES
from bot.interface import StartupError
from bot.messages import (
    CommandResult,
    Community,
    IncomingMessage,
    Reply,
    ReplyKind,
)
from bot.settings import Settings
from tests.adapters.conftest import REFUSAL
from tests.fakes import discord_fixtures
from tests.fakes.discord_fixtures import MANAGE_GUILD, SEND_MESSAGES, is_ephemeral
from tests.fakes.discord_server import (
    FakeChannel,
    FakeDiscord,
    FakeGuild,
    FakeUser,
    RecordedRequest,
)
from tests.fakes.recording_runtime import RecordingRuntime


def make_settings(fake: FakeDiscord, **overrides: Any) -> Settings:
    return Settings(  # type: ignore[call-arg]
        _env_file=None,
        discord_token="test-token",
        discord_api_base_url=fake.api_base,
        discord_gateway_url=fake.gateway_url,
        **overrides,
    )


def running(
    fake: FakeDiscord, runtime: RecordingRuntime, **overrides: Any
) -> contextlib.AbstractAsyncContextManager[DiscordAdapter]:
    return discord_fixtures.running(runtime, make_settings(fake, **overrides))


def is_message_post(request: RecordedRequest, channel_id: int | None = None) -> bool:
    """A POST of a channel message (to `channel_id` if given), failed attempts included."""
    path = f"/channels/{channel_id}/messages" if channel_id else "/messages"
    return (
        request.method == "POST"
        and request.path.startswith("/channels/")
        and request.path.endswith(path)
    )


def sent_messages(fake: FakeDiscord) -> list[RecordedRequest]:
    return [r for r in fake.requests if is_message_post(r)]


async def wait_sent(
    fake: FakeDiscord, count: int = 1, channel_id: int | None = None
) -> list[RecordedRequest]:
    return await fake.wait_for(lambda r: is_message_post(r, channel_id), count=count)


def guild_and_channel(fake: FakeDiscord, index: int = 0) -> tuple[FakeGuild, FakeChannel]:
    guild = fake.guilds[index]
    return guild, guild.channels[0]


# --------------------------------------------------------------------------- messages


async def test_the_answer_does_not_wait_for_the_typing_request(
    fake: FakeDiscord, runtime: RecordingRuntime, alice: FakeUser
) -> None:
    """Discord is slow to acknowledge the typing indicator: the runtime already has the
    message meanwhile, and the reply still goes out after the indicator."""
    guild, channel = guild_and_channel(fake)
    other = fake.add_thread(guild, channel)
    fake.typing_gate = asyncio.Event()
    handled = asyncio.Event()

    def answer(message: IncomingMessage) -> Reply:
        handled.set()
        return Reply(text=f"echo: {message.text}")

    runtime.answer = answer
    async with running(fake, runtime):
        await fake.message_create(
            channel=channel, author=alice, content=f"<@{fake.bot.id}> hi", mentions=[fake.bot]
        )
        await asyncio.wait_for(handled.wait(), 5)
        await fake.wait_for(lambda r: r.path == f"/channels/{channel.id}/typing")
        # Barrier: a later message (in another channel, so no rate-limit bucket is
        # shared) gets as far as its own typing request. The first answer was ready
        # before the barrier was even sent, so a reply that did not wait for its
        # indicator would have been posted by now.
        await fake.message_create(
            channel=other, author=alice, content=f"<@{fake.bot.id}> barrier", mentions=[fake.bot]
        )
        await fake.wait_for(lambda r: r.path == f"/channels/{other.id}/typing")
        early = list(sent_messages(fake))
        fake.typing_gate.set()  # before asserting, so a failure does not hang the teardown
        assert early == []
        sent = await wait_sent(fake, count=2)
    assert sorted((r.path, r.json["content"]) for r in sent) == sorted(
        [
            (f"/channels/{channel.id}/messages", "echo: hi"),
            (f"/channels/{other.id}/messages", "echo: barrier"),
        ]
    )


async def test_mention_types_then_replies_without_pinging(
    fake: FakeDiscord, runtime: RecordingRuntime, alice: FakeUser
) -> None:
    bob = FakeUser(9002, "bob", "Bobby")
    guild, channel = guild_and_channel(fake)
    async with running(fake, runtime):
        trigger = await fake.message_create(
            channel=channel,
            author=alice,
            content=f"<@{fake.bot.id}> what does <@!{bob.id}> think?",
            mentions=[fake.bot, bob],
        )
        [sent] = await wait_sent(fake)

    typing = fake.find("POST", f"/channels/{channel.id}/typing")
    assert typing and fake.requests.index(typing[0]) < fake.requests.index(sent)
    assert sent.path == f"/channels/{channel.id}/messages"
    assert str(sent.json["message_reference"]["message_id"]) == trigger["id"]
    assert sent.json["allowed_mentions"] == {"parse": [], "replied_user": False}
    # A trigger deleted while the model thinks must not turn the answer into a 400.
    assert sent.json["message_reference"]["fail_if_not_exists"] is False
    assert sent.json["content"] == "echo: what does @Bobby think?"
    assert sent.headers["Authorization"] == "Bot test-token"

    [msg] = runtime.messages
    assert msg.text == "what does @Bobby think?"
    assert msg.community == Community(id=f"discord:{guild.id}", name="Guild One")
    assert (msg.channel_id, msg.thread_id, msg.message_id) == (str(channel.id), None, trigger["id"])
    assert msg.user.id == str(alice.id) and msg.user.name == "Alice" and msg.addressed

    intents = fake.identifies[0]["intents"]
    assert intents & 1 and intents & (1 << 9)  # guilds, guild messages
    assert not intents & (1 << 15)  # Message Content is opt-in
    assert not intents & (1 << 12)  # no DMs unless allowed
    assert not intents & (1 << 1)  # no members intent


async def test_reply_to_bot_message_triggers(
    fake: FakeDiscord, runtime: RecordingRuntime, alice: FakeUser
) -> None:
    _, channel = guild_and_channel(fake)
    async with running(fake, runtime):
        bot_said = fake.message_payload(
            channel_id=channel.id, author=fake.bot, content="I think so."
        )
        trigger = await fake.message_create(
            channel=channel, author=alice, content="why though?", reply_to=bot_said
        )
        [sent] = await wait_sent(fake)
    assert str(sent.json["message_reference"]["message_id"]) == trigger["id"]
    assert [m.text for m in runtime.messages] == ["why though?"]


async def test_ignores_bots_empty_and_unaddressed_messages(
    fake: FakeDiscord, runtime: RecordingRuntime, alice: FakeUser
) -> None:
    _, channel = guild_and_channel(fake)
    other_bot = FakeUser(7777, "otherbot", "Other", bot=True)
    mention = f"<@{fake.bot.id}>"
    async with running(fake, runtime):
        await fake.message_create(
            channel=channel, author=other_bot, content=f"{mention} hi", mentions=[fake.bot]
        )
        await fake.message_create(
            channel=channel, author=fake.bot, content=f"{mention} me", mentions=[fake.bot]
        )
        await fake.message_create(channel=channel, author=alice, content="just chatting")
        other_reply = fake.message_payload(channel_id=channel.id, author=alice, content="x")
        await fake.message_create(channel=channel, author=alice, content="re", reply_to=other_reply)
        await fake.message_create(
            channel=channel, author=alice, content=mention, mentions=[fake.bot]
        )
        await fake.message_create(channel=channel, author=alice, content="@everyone news")
        await fake.message_create(
            channel=channel, author=alice, content=f"{mention} barrier", mentions=[fake.bot]
        )
        await wait_sent(fake)
        # Barrier: a second answer in the same channel; a late send or typing request
        # for anything above would have been recorded by the time it is posted.
        await fake.message_create(
            channel=channel, author=alice, content=f"{mention} second barrier", mentions=[fake.bot]
        )
        await fake.wait_for(
            lambda r: is_message_post(r) and r.json["content"] == "echo: second barrier"
        )
    assert [m.text for m in runtime.messages] == ["barrier", "second barrier"]
    assert [r.json["content"] for r in sent_messages(fake)] == [
        "echo: barrier",
        "echo: second barrier",
    ]
    assert len(fake.find("POST", "/typing")) == 2


async def test_long_answer_is_split_with_balanced_fences(
    fake: FakeDiscord, runtime: RecordingRuntime, alice: FakeUser
) -> None:
    _, channel = guild_and_channel(fake)
    code = "\n".join(f"    step_{i} = compute({i})  # explain" for i in range(80))
    answer = (
        "Here is how.\n\n```python\n" + code + "\n```\n\n" + "And that is all. " * 110 + "Done."
    )
    assert 4500 <= len(answer) < 6000
    runtime.answer = lambda m: Reply(text=answer)
    async with running(fake, runtime):
        trigger = await fake.message_create(
            channel=channel, author=alice, content=f"<@{fake.bot.id}> show", mentions=[fake.bot]
        )
        # Barrier: the chunks go out one after another, so the one holding the answer's
        # last word is the last of them.
        await fake.wait_for(
            lambda r: is_message_post(r) and r.json["content"].rstrip().endswith("Done.")
        )
    bodies = [r.json for r in sent_messages(fake)]
    assert len(bodies) >= 3
    for body in bodies:
        assert len(body["content"]) <= 2000
        assert body["content"].count("```") % 2 == 0
        assert str(body["message_reference"]["message_id"]) == trigger["id"]
        assert body["allowed_mentions"] == {"parse": [], "replied_user": False}
    joined = "".join(b["content"] for b in bodies)
    assert "step_59 = compute(59)" in joined and joined.count("```python") >= 2
    assert joined.count("Done.") == 1


async def test_notice_reply_is_sent_the_same_way(
    fake: FakeDiscord, runtime: RecordingRuntime, alice: FakeUser
) -> None:
    _, channel = guild_and_channel(fake)
    runtime.answer = lambda m: Reply(text="Slow down a little.", kind=ReplyKind.NOTICE)
    async with running(fake, runtime):
        trigger = await fake.message_create(
            channel=channel, author=alice, content=f"<@{fake.bot.id}> hi", mentions=[fake.bot]
        )
        [sent] = await wait_sent(fake)
    assert sent.json["content"] == "Slow down a little."
    assert str(sent.json["message_reference"]["message_id"]) == trigger["id"]


async def test_thread_message_is_answered_in_the_thread(
    fake: FakeDiscord, runtime: RecordingRuntime, alice: FakeUser
) -> None:
    guild, channel = guild_and_channel(fake)
    thread = fake.add_thread(guild, channel)
    async with running(fake, runtime):
        await fake.message_create(
            channel=thread, author=alice, content=f"<@{fake.bot.id}> in here", mentions=[fake.bot]
        )
        [sent] = await wait_sent(fake)
    assert sent.path == f"/channels/{thread.id}/messages"
    [msg] = runtime.messages
    assert (msg.channel_id, msg.thread_id) == (str(channel.id), str(thread.id))


async def test_two_guilds_are_two_communities(
    fake: FakeDiscord, runtime: RecordingRuntime, alice: FakeUser
) -> None:
    fake.add_guild("Guild Two", members=[alice])
    async with running(fake, runtime):
        for guild in fake.guilds:
            await fake.message_create(
                channel=guild.channels[0],
                author=alice,
                content=f"<@{fake.bot.id}> hello {guild.name}",
                mentions=[fake.bot],
            )
        await wait_sent(fake, count=2)
    communities = {m.community for m in runtime.messages}
    assert communities == {Community(id=f"discord:{g.id}", name=g.name) for g in fake.guilds}


async def test_dms_are_private_communities_only_when_allowed(
    fake: FakeDiscord, runtime: RecordingRuntime, alice: FakeUser
) -> None:
    dm = FakeChannel(fake.snowflake(), "dm")

    async def send_dm(text: str) -> None:
        data = fake.message_payload(channel_id=dm.id, author=alice, content=text)
        await fake.dispatch("MESSAGE_CREATE", data)

    _, channel = guild_and_channel(fake)
    async with running(fake, runtime):
        await send_dm("ignored: DMs are off")
        # Barrier: a later guild message is answered, so the DM before it was seen.
        await fake.message_create(
            channel=channel, author=alice, content=f"<@{fake.bot.id}> barrier", mentions=[fake.bot]
        )
        [barrier] = await wait_sent(fake)
    assert [m.text for m in runtime.messages] == ["barrier"]
    assert barrier.path == f"/channels/{channel.id}/messages"
    runtime.messages.clear()

    async with running(fake, runtime, discord_allow_dms=True):
        await send_dm("hello privately")
        [sent] = await wait_sent(fake, channel_id=dm.id)
    assert fake.identifies[-1]["intents"] & (1 << 12)
    [msg] = runtime.messages
    assert msg.community.id == f"discord:dm:{alice.id}" and msg.text == "hello privately"
    assert sent.path == f"/channels/{dm.id}/messages"


async def test_rate_limited_reply_is_retried_and_arrives_once(
    fake: FakeDiscord, runtime: RecordingRuntime, alice: FakeUser
) -> None:
    _, channel = guild_and_channel(fake)
    fake.fail_next_messages_with_429(1, retry_after=0.05)
    async with running(fake, runtime):
        await fake.message_create(
            channel=channel, author=alice, content=f"<@{fake.bot.id}> hi", mentions=[fake.bot]
        )
        await wait_sent(fake, count=2)
        # Barrier: a later message's reply in the same channel (the same rate-limit
        # bucket) arrives after the retried one; a third attempt at the first reply
        # would have been made before it.
        await fake.message_create(
            channel=channel, author=alice, content=f"<@{fake.bot.id}> barrier", mentions=[fake.bot]
        )
        await wait_sent(fake, count=3)
    attempts = [r.json["content"] for r in sent_messages(fake)]
    assert attempts == ["echo: hi", "echo: hi", "echo: barrier"]
    delivered = [m for m in fake.messages.values() if m["author"]["id"] == str(fake.bot.id)]
    assert [m["content"] for m in delivered] == ["echo: hi", "echo: barrier"]


async def test_discord_errors_are_logged_not_fatal(
    fake: FakeDiscord,
    runtime: RecordingRuntime,
    alice: FakeUser,
    caplog: pytest.LogCaptureFixture,
) -> None:
    guild, channel = guild_and_channel(fake)
    fake.fail_next_messages_with(403, code=50001, message="Missing Access")
    async with running(fake, runtime):
        await fake.message_create(
            channel=channel, author=alice, content=f"<@{fake.bot.id}> one", mentions=[fake.bot]
        )
        await wait_sent(fake)
        await fake.message_create(
            channel=channel, author=alice, content=f"<@{fake.bot.id}> two", mentions=[fake.bot]
        )
        await wait_sent(fake, count=2)
    assert [m.text for m in runtime.messages] == ["one", "two"]
    errors = [r.getMessage() for r in caplog.records if r.name == "adapters.discord"]
    assert any(
        "403" in e and "50001" in e and str(guild.id) in e and str(channel.id) in e for e in errors
    )


# --------------------------------------------------------------------------- startup


async def test_disallowed_intents_close_is_a_clear_startup_error(
    fake: FakeDiscord, runtime: RecordingRuntime
) -> None:
    fake.close_with_4014 = True
    adapter = DiscordAdapter(runtime, make_settings(fake), identify_delay=0)
    with pytest.raises(StartupError) as info:
        await asyncio.wait_for(adapter.start(), 10)
    assert str(info.value) == INTENTS_HELP
    assert "Message Content Intent" in INTENTS_HELP and "Privileged Gateway Intents" in INTENTS_HELP
    assert "\n" not in INTENTS_HELP


async def test_bad_or_missing_token_is_a_clear_startup_error(
    fake: FakeDiscord, runtime: RecordingRuntime
) -> None:
    fake.token = "the-real-token"
    adapter = DiscordAdapter(runtime, make_settings(fake), identify_delay=0)
    with pytest.raises(StartupError) as info:
        await asyncio.wait_for(adapter.start(), 10)
    assert str(info.value) == TOKEN_HELP
    assert fake.find("GET", "/users/@me") and not fake.identifies

    no_token = make_settings(fake)
    no_token.discord_token = None
    with pytest.raises(StartupError, match="DISCORD_TOKEN"):
        await DiscordAdapter(runtime, no_token).start()


async def test_commands_synced_globally_or_to_dev_guild(
    fake: FakeDiscord, runtime: RecordingRuntime
) -> None:
    async with running(fake, runtime):
        pass
    [put] = fake.find("PUT", "/commands")
    assert put.path == f"/applications/{fake.application_id}/commands"
    assert "Authorization" in put.headers
    [group] = put.json
    assert group["name"] == "sonality"
    # Everyone sees /sonality (moderator subcommands are checked in code); guild installs.
    assert group.get("default_member_permissions") is None
    assert group["integration_types"] == [0] and group["contexts"] == [0]
    subs = {o["name"]: o for o in group["options"]}
    assert set(subs) == set(COMMAND_NAMES)
    assert subs["rollback"]["options"][0]["autocomplete"] is True
    assert subs["beliefs"]["options"][0]["autocomplete"] is True

    dev = fake.guilds[0].id
    async with running(fake, runtime, discord_dev_guild_id=dev):
        pass
    [guild_put] = [r for r in fake.find("PUT", "/commands") if "/guilds/" in r.path]
    assert guild_put.path == f"/applications/{fake.application_id}/guilds/{dev}/commands"


async def test_sharded_client_identifies_each_shard(
    fake: FakeDiscord, runtime: RecordingRuntime, alice: FakeUser
) -> None:
    for i in range(3):
        fake.add_guild(f"Extra {i}", members=[alice])
    async with running(fake, runtime, discord_shard_count=2) as adapter:
        assert sorted(tuple(i["shard"]) for i in fake.identifies) == [(0, 2), (1, 2)]
        assert adapter.client is not None and len(adapter.client.guilds) == 4
        for guild in fake.guilds:
            await fake.message_create(
                channel=guild.channels[0],
                author=alice,
                content=f"<@{fake.bot.id}> hi",
                mentions=[fake.bot],
            )
        await wait_sent(fake, count=4)
    assert not fake.find("GET", "/gateway/bot")  # shard_count given: no lookup


# --------------------------------------------------------------------------- commands


def callbacks(fake: FakeDiscord, interaction_id: int) -> list[RecordedRequest]:
    return fake.find("POST", f"/interactions/{interaction_id}/")


async def test_beliefs_defers_then_edits_original(
    fake: FakeDiscord, runtime: RecordingRuntime, alice: FakeUser
) -> None:
    guild, channel = guild_and_channel(fake)
    async with running(fake, runtime):
        iid, token = await fake.interaction_create(
            guild=guild,
            channel=channel,
            user=alice,
            subcommand="beliefs",
            options=[{"name": "topic", "type": 3, "value": "ethics"}],
        )
        [patch] = await fake.wait_for(lambda r: r.method == "PATCH")
    [callback] = callbacks(fake, iid)
    assert callback.path == f"/interactions/{iid}/{token}/callback"
    assert callback.json["type"] == 5
    assert not is_ephemeral(callback)
    assert "Authorization" not in callback.headers and "Authorization" not in patch.headers
    assert fake.requests.index(callback) < fake.requests.index(patch)
    assert patch.path == f"/webhooks/{fake.application_id}/{token}/messages/@original"
    assert patch.json["content"] == "beliefs(ethics) ran"
    assert patch.json["allowed_mentions"] == {"parse": []}
    [request] = runtime.commands
    assert request.community.id == f"discord:{guild.id}"
    assert (request.name, request.args, request.is_moderator) == ("beliefs", ("ethics",), False)
    assert request.caller.id == str(alice.id)


@pytest.mark.parametrize(
    ("permissions", "moderator", "answer"),
    [
        pytest.param(SEND_MESSAGES, False, REFUSAL, id="member-refused-ephemerally"),
        pytest.param(MANAGE_GUILD, True, "rollback(3) ran", id="moderator-runs-publicly"),
    ],
)
async def test_rollback_needs_manage_server(
    fake: FakeDiscord,
    runtime: RecordingRuntime,
    alice: FakeUser,
    permissions: int,
    moderator: bool,
    answer: str,
) -> None:
    guild, channel = guild_and_channel(fake)
    async with running(fake, runtime):
        iid, _ = await fake.interaction_create(
            guild=guild,
            channel=channel,
            user=alice,
            subcommand="rollback",
            options=[{"name": "version", "type": 4, "value": 3}],
            permissions=permissions,
        )
        [patch] = await fake.wait_for(lambda r: r.method == "PATCH")
    [callback] = callbacks(fake, iid)
    # Only the caller sees a refusal, and a deferral cannot be made ephemeral later.
    assert callback.json["type"] == 5 and is_ephemeral(callback) is not moderator
    assert patch.json["content"] == answer
    [request] = runtime.commands
    assert (request.name, request.args, request.is_moderator) == ("rollback", ("3",), moderator)


async def test_private_result_after_public_defer_goes_ephemeral(
    fake: FakeDiscord, runtime: RecordingRuntime, alice: FakeUser
) -> None:
    guild, channel = guild_and_channel(fake)
    runtime.command_result = lambda r: CommandResult(
        text="No snapshot yet.", ok=False, private=True
    )
    async with running(fake, runtime):
        _, token = await fake.interaction_create(
            guild=guild, channel=channel, user=alice, subcommand="snapshot"
        )
        [followup] = await fake.wait_for(
            lambda r: r.method == "POST" and r.path == f"/webhooks/{fake.application_id}/{token}"
        )
    assert fake.find("DELETE", f"/webhooks/{fake.application_id}/{token}/messages/@original")
    assert followup.json["content"] == "No snapshot yet." and followup.json["flags"] & 64


async def test_long_command_output_uses_followups_then_a_file(
    fake: FakeDiscord, runtime: RecordingRuntime, alice: FakeUser
) -> None:
    guild, channel = guild_and_channel(fake)
    size = {"n": 3000}
    runtime.command_result = lambda r: CommandResult(
        text="\n".join(f"v{i}: a change of mind" for i in range(size["n"] // 20)), title="History"
    )
    async with running(fake, runtime):
        _, token = await fake.interaction_create(
            guild=guild, channel=channel, user=alice, subcommand="history"
        )
        [followup] = await fake.wait_for(
            lambda r: r.method == "POST" and r.path == f"/webhooks/{fake.application_id}/{token}"
        )
        [patch] = fake.find("PATCH", token)
        assert patch.json["content"].startswith("**History**\nv0:")
        assert len(patch.json["content"]) <= 2000 and len(followup.json["content"]) <= 2000

        size["n"] = 20000
        _, token2 = await fake.interaction_create(
            guild=guild, channel=channel, user=alice, subcommand="history"
        )
        [patch2] = await fake.wait_for(lambda r: r.method == "PATCH" and token2 in r.path)
    [(filename, data)] = patch2.files
    assert filename == "sonality-history.txt" and data.decode().startswith("**History**\nv0:")
    assert "attached" in patch2.json["content"]


async def test_autocomplete_asks_runtime(
    fake: FakeDiscord, runtime: RecordingRuntime, alice: FakeUser
) -> None:
    guild, channel = guild_and_channel(fake)
    async with running(fake, runtime):
        iid, _ = await fake.interaction_create(
            guild=guild,
            channel=channel,
            user=alice,
            subcommand="beliefs",
            options=[{"name": "topic", "type": 3, "value": "eth", "focused": True}],
            autocomplete=True,
        )
        await fake.wait_for(lambda r: f"/interactions/{iid}/" in r.path)
        iid2, _ = await fake.interaction_create(
            guild=guild,
            channel=channel,
            user=alice,
            subcommand="diff",
            options=[
                {"name": "a", "type": 4, "value": "", "focused": True},
            ],
            autocomplete=True,
            permissions=MANAGE_GUILD,
        )
        await fake.wait_for(lambda r: f"/interactions/{iid2}/" in r.path)
    [topics] = callbacks(fake, iid)
    assert topics.json == {
        "type": 8,
        "data": {
            "choices": [
                {"name": "ethics", "value": "ethics"},
                {"name": "ethereum", "value": "ethereum"},
            ]
        },
    }
    [versions] = callbacks(fake, iid2)
    assert [c["value"] for c in versions.json["data"]["choices"]] == [3, 2, 1]
    assert [(c.id, k, p) for c, k, p in runtime.completions] == [
        (f"discord:{guild.id}", "topic", "eth"),
        (f"discord:{guild.id}", "version", ""),
    ]


@pytest.mark.parametrize(
    ("subcommand", "options", "args", "ephemeral"),
    [
        pytest.param(
            "usage", [{"name": "days", "type": 4, "value": 30}], ("30",), False, id="usage-30"
        ),
        pytest.param("usage", [], (), False, id="usage-default"),
        pytest.param("budget", [], (), False, id="budget-look"),
        pytest.param(
            "budget",
            [{"name": "amount", "type": 3, "value": "off"}],
            ("off",),
            True,
            id="budget-off",
        ),
    ],
)
async def test_usage_and_budget_pass_their_options_through(
    fake: FakeDiscord,
    runtime: RecordingRuntime,
    alice: FakeUser,
    subcommand: str,
    options: list[dict[str, Any]],
    args: tuple[str, ...],
    ephemeral: bool,
) -> None:
    """A member may look at the budget publicly; setting it is a moderator command, so a
    member's attempt is deferred privately (its refusal is for the caller only)."""
    guild, channel = guild_and_channel(fake)
    async with running(fake, runtime):
        iid, _ = await fake.interaction_create(
            guild=guild,
            channel=channel,
            user=alice,
            subcommand=subcommand,
            options=options,
            permissions=SEND_MESSAGES,
        )
        [patch] = await fake.wait_for(lambda r: r.method == "PATCH")
    [callback] = callbacks(fake, iid)
    assert is_ephemeral(callback) is ephemeral
    [request] = runtime.commands
    assert (request.name, request.args, request.is_moderator) == (subcommand, args, False)
    assert (patch.json["content"] == REFUSAL) is ephemeral


async def test_a_dm_command_with_dms_off_is_answered_and_not_run(
    fake: FakeDiscord,
    runtime: RecordingRuntime,
    alice: FakeUser,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A registration from when DMs were allowed still offers `/sonality` in DMs (one
    synced to a development guild is never replaced): with DMs off the command is
    answered privately and never reaches the runtime."""
    monkeypatch.setattr(fake, "_offered_in_dms", lambda command: True)
    dm = FakeChannel(fake.snowflake(), "dm")
    async with running(fake, runtime):
        iid, token = await fake.interaction_create(
            guild=None, channel=dm, user=alice, subcommand="beliefs"
        )
        [callback] = await fake.wait_for(
            lambda r: r.method == "POST" and r.path == f"/interactions/{iid}/{token}/callback"
        )
    assert runtime.commands == []
    assert callback.json["type"] == 4 and is_ephemeral(callback)
    assert "direct messages" in callback.json["data"]["content"]
