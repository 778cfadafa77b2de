"""End to end: real discord.py ↔ fake Discord, real runtime, real SDK ↔ fake Anthropic.

Nothing is mocked. The adapter only points discord.py at tests/fakes/discord_server.py
through DISCORD_API_BASE_URL / DISCORD_GATEWAY_URL (as in production settings); the
runtime is the one `app.wiring.open_runtime` builds (SQLite, Chroma, offline embeddings,
the engine), and its LLM is the anthropic SDK talking to the loopback fake. Every
assertion is about what went over the wire or what the runtime stored.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from adapters.discord import DiscordAdapter
from app.wiring import open_runtime
from bot.messages import LLM_DOWN
from bot.runtime import Runtime
from bot.timeline import HEIGHT_PX, WIDTH_PX
from sonality.agent import SonalityAgent
from tests.fakes.anthropic_server import AnthropicFake, Fault
from tests.fakes.discord_fixtures import (
    MANAGE_GUILD,
    SEND_MESSAGES,
    is_ephemeral,
    restores_discord_endpoints,  # noqa: F401
    running,
)
from tests.fakes.discord_server import (
    FakeChannel,
    FakeDiscord,
    FakeGuild,
    FakeUser,
    RecordedRequest,
)
from tests.integration.conftest import make_settings
from tests.integration.test_isolation_and_commands import CANARY, CANARY_TEXT
from tests.integration.test_timeline import png_size

NO_PINGS = {"parse": [], "replied_user": False}
TOPIC = CANARY["topics"][0]
# discord.py schedules each on_message / app command in a task with these names.
HANDLER_TASKS = ("discord.py: on_message", "CommandTree-invoker")
WAIT = 10.0


@dataclass
class World:
    fake: FakeDiscord
    runtime: Runtime
    adapter: DiscordAdapter
    anthropic: AnthropicFake
    guild_a: FakeGuild
    guild_b: FakeGuild
    member: FakeUser
    moderator: FakeUser

    @staticmethod
    def community(guild: FakeGuild) -> str:
        return f"discord:{guild.id}"

    def agent(self, guild: FakeGuild) -> SonalityAgent:
        agent = self.runtime.registry.get(self.community(guild))
        assert agent is not None, f"no agent loaded for {self.community(guild)}"
        return agent


@contextlib.asynccontextmanager
async def discord_world(
    tmp_path: Path,
    llm: Any,
    anthropic: AnthropicFake,
    *,
    fake: FakeDiscord | None = None,
    others: Sequence[FakeUser] = (),
    channels: int = 1,
    **settings: Any,
) -> AsyncIterator[World]:
    """Two guilds with a member and a moderator each (and `others`), `channels` channels
    each, the bot connected to them; `settings` are added to the bot's. A test that
    needs the bot's id in its settings passes the `fake` it made."""
    member = FakeUser(9001, "alice", "Alice")
    moderator = FakeUser(9002, "mod", "Mo")
    fake = fake or FakeDiscord()
    people = [member, moderator, *others]
    guild_a = fake.add_guild("Guild A", channels=channels, members=people)
    guild_b = fake.add_guild("Guild B", channels=channels, members=people)
    await fake.start()
    config = make_settings(
        tmp_path / "data",
        DISCORD_TOKEN="test-token",
        DISCORD_API_BASE_URL=fake.api_base,
        DISCORD_GATEWAY_URL=fake.gateway_url,
        **settings,
    )
    try:
        async with (
            open_runtime(config, llm=llm) as runtime,
            running(runtime, config, ready_within=WAIT) as adapter,
        ):
            yield World(fake, runtime, adapter, anthropic, guild_a, guild_b, member, moderator)
    finally:
        await fake.close()


@pytest.fixture
async def world(tmp_path: Path, llm: Any, anthropic_server: AnthropicFake) -> AsyncIterator[World]:
    async with discord_world(tmp_path, llm, anthropic_server) as started:
        yield started


# --------------------------------------------------------------------------- helpers


async def settle(world: World) -> None:
    """Until discord.py's handler tasks have finished and background learning is done.

    Call it only after the handler was seen acting (a POST or PATCH arrived): before
    the gateway event reaches discord.py there is no task to wait for.
    """
    me = asyncio.current_task()
    async with asyncio.timeout(WAIT):
        while True:
            busy = [
                t
                for t in asyncio.all_tasks()
                if t is not me and not t.done() and t.get_name() in HANDLER_TASKS
            ]
            if not busy:
                break
            await asyncio.wait(busy)
    await world.runtime.drain()


def is_reply_post(request: RecordedRequest, trigger: dict[str, Any]) -> bool:
    """A POST of a channel message that references `trigger` (failed attempts too)."""
    if request.method != "POST" or request.path != f"/channels/{trigger['channel_id']}/messages":
        return False
    reference = (request.json or {}).get("message_reference") or {}
    return str(reference.get("message_id")) == trigger["id"]


def replies_to(world: World, trigger: dict[str, Any]) -> list[RecordedRequest]:
    return [r for r in world.fake.requests if is_reply_post(r, trigger)]


def delivered_to(world: World, trigger: dict[str, Any]) -> list[dict[str, Any]]:
    """The bot messages the fake actually stored as replies to `trigger`."""
    return [
        m
        for m in world.fake.messages.values()
        if m["author"]["id"] == str(world.fake.bot.id)
        # the fake stores the reference as discord.py sent it (an int): compare as text
        and str((m.get("message_reference") or {}).get("message_id")) == trigger["id"]
    ]


async def mention(
    world: World,
    guild: FakeGuild,
    text: str,
    *,
    author: FakeUser | None = None,
    posts: int = 1,
) -> tuple[dict[str, Any], list[RecordedRequest]]:
    """@mention the bot in `guild`, wait for `posts` reply POSTs, then settle."""
    fake = world.fake
    trigger = await fake.message_create(
        channel=guild.channels[0],
        author=author or world.member,
        content=f"<@{fake.bot.id}> {text}",
        mentions=[fake.bot],
    )
    await fake.wait_for(lambda r: is_reply_post(r, trigger), count=posts, seconds=WAIT)
    await settle(world)
    return trigger, replies_to(world, trigger)


async def slash(
    world: World,
    guild: FakeGuild | None,
    subcommand: str,
    *,
    options: list[dict[str, Any]] | None = None,
    permissions: int = SEND_MESSAGES,
    user: FakeUser | None = None,
    channel: FakeChannel | None = None,
) -> tuple[RecordedRequest, RecordedRequest]:
    """/sonality <subcommand> as INTERACTION_CREATE, in `channel` (default: the guild's
    first; with no guild, a DM channel); returns (callback, PATCH @original)."""
    fake = world.fake
    where = channel or (guild.channels[0] if guild is not None else None)
    assert where is not None, "a DM needs its channel"
    iid, token = await fake.interaction_create(
        guild=guild,
        channel=where,
        user=user or world.member,
        subcommand=subcommand,
        options=options,
        permissions=permissions,
    )
    original = f"/webhooks/{fake.application_id}/{token}/messages/@original"
    [patch] = await fake.wait_for(
        lambda r: r.method == "PATCH" and r.path == original, seconds=WAIT
    )
    await settle(world)
    [callback] = fake.find("POST", f"/interactions/{iid}/{token}/callback")
    assert fake.requests.index(callback) < fake.requests.index(patch)
    assert callback.json["type"] == 5  # deferred, "thinking…"
    return callback, patch


def assert_plain_reply(post: RecordedRequest, trigger: dict[str, Any]) -> None:
    body = post.json
    assert str(body["message_reference"]["message_id"]) == trigger["id"]
    assert body["allowed_mentions"] == NO_PINGS
    assert 0 < len(body["content"]) <= 2000


async def teach_canary(world: World) -> None:
    """The canary argument plus three more turns: the staged update commits (cooling 3)."""
    world.anthropic.brain.ess_rule(**CANARY)
    for text in [CANARY_TEXT, "what do you think?", "fair enough", "anything else?"]:
        trigger, posts = await mention(world, world.guild_a, text)
        assert len(posts) == 1 and len(delivered_to(world, trigger)) == 1
        assert_plain_reply(posts[0], trigger)
    agent = world.agent(world.guild_a)
    assert agent.sponge.opinion_vectors.get(TOPIC, 0) > 0
    assert agent.sponge.version == 4 and agent.sponge.interaction_count == 4


# --------------------------------------------------------------------------- tests


async def test_canary_learned_in_one_guild_never_shows_in_the_other(world: World) -> None:
    await teach_canary(world)
    a, b = world.guild_a, world.guild_b
    # The ESS call really rated the Discord message (mention stripped, plain text).
    brain = world.anthropic.brain
    rated = [
        brain.rated_message(r)
        for r in world.anthropic.requests
        if r.tool_name == brain.ess_tool_name
    ]
    assert CANARY_TEXT in rated

    callback_a, patch_a = await slash(world, a, "beliefs")
    assert not is_ephemeral(callback_a)
    assert f"{TOPIC}: +" in patch_a.json["content"]
    assert "road-safety audit" in patch_a.json["content"]
    assert patch_a.json["allowed_mentions"] == {"parse": []}

    callback_b, patch_b = await slash(world, b, "beliefs")
    assert not is_ephemeral(callback_b)
    assert "canary" not in patch_b.json["content"]
    assert "no beliefs" in patch_b.json["content"]

    agent_b = world.agent(b)  # the command loaded B's own agent
    assert agent_b is not world.agent(a)
    assert TOPIC not in agent_b.sponge.opinion_vectors
    assert agent_b.sponge.interaction_count == 0
    assert await world.runtime.db.community(world.community(b)).pending_count() == 0


async def test_only_manage_server_can_roll_back(world: World) -> None:
    await teach_canary(world)
    a = world.guild_a
    store = world.runtime.db.community(world.community(a))
    agent = world.agent(a)
    before = await store.latest_version()
    assert before == agent.sponge.version == 4

    version_0 = [{"name": "version", "type": 4, "value": 0}]
    callback, patch = await slash(world, a, "rollback", options=version_0)
    assert is_ephemeral(callback)  # only the caller sees the refusal
    assert "Only moderators" in patch.json["content"]
    assert await store.latest_version() == before == agent.sponge.version
    assert TOPIC in agent.sponge.opinion_vectors
    [refused] = await world.runtime.db.moderator_actions(world.community(a))
    assert refused.actor_id == str(world.member.id) and refused.allowed is False

    callback, patch = await slash(
        world, a, "rollback", options=version_0, permissions=MANAGE_GUILD, user=world.moderator
    )
    assert not is_ephemeral(callback)
    assert "Reset to the seed personality as v5" in patch.json["content"]
    assert "/sonality rollback 4" in patch.json["content"]
    assert await store.latest_version() == 5 == agent.sponge.version
    assert agent.sponge.opinion_vectors == {}

    _, beliefs = await slash(world, a, "beliefs")
    assert "canary" not in beliefs.json["content"]
    assert "no beliefs" in beliefs.json["content"]


async def test_long_answer_arrives_in_balanced_chunks(world: World) -> None:
    code = "\n".join(f"    step_{i} = compute({i})  # explain" for i in range(80))
    answer = "Here is how.\n\n```python\n" + code + "\n```\n\n" + "And that is all. " * 100
    assert 4500 <= len(answer) < 6000 and answer.count("```") == 2
    world.anthropic.brain.reply_rule(contains="show me the pipeline", text=answer)

    trigger, posts = await mention(world, world.guild_a, "show me the pipeline", posts=3)
    assert len(posts) >= 3 and len(delivered_to(world, trigger)) == len(posts)
    for post in posts:
        assert_plain_reply(post, trigger)
        assert post.json["content"].count("```") % 2 == 0
    # What the member finally sees (a streamed reply's first posts are edited to this).
    final = sorted(delivered_to(world, trigger), key=lambda m: int(m["id"]))
    assert all(m["content"].count("```") % 2 == 0 for m in final)
    joined = "".join(m["content"] for m in final)
    assert joined.count("```python") >= 2  # the block was closed and reopened
    for i in (0, 40, 79):
        assert f"step_{i} = compute({i})" in joined
    assert world.agent(world.guild_a).sponge.interaction_count == 1


async def test_llm_outage_gives_one_apology_and_learns_nothing(world: World) -> None:
    a = world.guild_a
    await mention(world, a, "hello there")
    agent = world.agent(a)
    store = world.runtime.db.community(world.community(a))
    version, count = agent.sponge.version, agent.sponge.interaction_count
    assert (version, count) == (1, 1)
    calls = len(world.anthropic.requests)

    world.anthropic.enqueue(*[Fault(status=500, retry_after_ms=5)] * 3)
    trigger, posts = await mention(world, a, "are you there?")
    assert world.anthropic.script_left == 0
    assert len(world.anthropic.requests) - calls == 3  # one call, two SDK retries
    [post] = posts
    assert_plain_reply(post, trigger)
    assert post.json["content"] == LLM_DOWN and len(LLM_DOWN) < 200
    assert len(delivered_to(world, trigger)) == 1
    assert agent.sponge.version == version and agent.sponge.interaction_count == count
    assert await store.latest_version() == version
    assert await store.pending_count() == 0


async def test_rate_limited_reply_arrives_once_and_learning_happens_once(world: World) -> None:
    world.fake.fail_next_messages_with_429(1, retry_after=0.05)
    trigger, posts = await mention(world, world.guild_a, "hi, slowly", posts=2)
    assert len(posts) == 2  # the 429'd attempt and the retry
    assert posts[0].json == posts[1].json
    assert_plain_reply(posts[1], trigger)
    [delivered] = delivered_to(world, trigger)
    assert delivered["content"] == posts[1].json["content"]
    agent = world.agent(world.guild_a)
    assert agent.sponge.interaction_count == 1 and agent.sponge.version == 1
    assert await world.runtime.db.community(world.community(world.guild_a)).pending_count() == 0


async def test_timeline_arrives_as_an_attachment_of_the_commands_answer(world: World) -> None:
    await teach_canary(world)
    a = world.guild_a
    callback, patch = await slash(world, a, "timeline")
    assert not is_ephemeral(callback)  # a picture for everyone in the channel
    [(filename, data)] = patch.files  # multipart: the PNG rides on the deferred answer's edit
    assert filename == "timeline-v4.png"
    assert png_size(data) == (WIDTH_PX, HEIGHT_PX)
    assert patch.json["content"].startswith("**Timeline**\nOpinion timeline")
    [attachment] = patch.json["attachments"]
    assert attachment["filename"] == filename
    assert attachment["description"].startswith(f"Opinion timeline: {TOPIC}")  # alt text

    options = [
        {"name": "topic", "type": 3, "value": "zebra"},
        {"name": "days", "type": 4, "value": 30},
    ]
    _, patch = await slash(world, a, "timeline", options=options)
    [(filename, _)] = patch.files
    assert filename == f"timeline-v4-{TOPIC}.png"
    # The synced command tree offers the subcommand with both options, bounded.
    [sync] = world.fake.find("PUT", "/commands")
    [group] = sync.json
    [sub] = [o for o in group["options"] if o["name"] == "timeline"]
    by_name = {o["name"]: o for o in sub["options"]}
    assert by_name["topic"]["autocomplete"] is True and by_name["topic"]["type"] == 3
    assert (by_name["days"]["min_value"], by_name["days"]["max_value"]) == (1, 365)
