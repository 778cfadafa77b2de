"""Forget-me accepted on each platform, end to end through the real adapters (issue 11):
two members argue opposite stances and a third chats; the arguer FOR runs forget-me and
confirms it. Afterwards their unique word and their id are in no byte of the SQLite file
(and its WAL), of any file under Chroma's directory, or of any LLM request sent after
the forget-me (more messages and a reflection included); the opinions equal, within
1e-9, those of a fresh community that heard only the other two (same ESS results, no
reflection by count or time); and the other two members' rows and memories are as they
were.

The scenario, the scans and the comparison are shared (tests/integration/forget_scenario.py);
each test only makes members speak its platform's way: the terminal adapter's lines
(`/as NAME`), Discord's gateway events and interactions through discord.py, Slack's
signed Events API requests and slash commands through slack-bolt.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from pathlib import Path

import aiohttp
import pytest

from adapters.terminal import COMMUNITY as TERMINAL
from adapters.terminal import TerminalAdapter
from app.wiring import open_runtime
from bot.runtime import Runtime
from providers.anthropic import AnthropicLLM
from tests.fakes.anthropic_server import AnthropicFake
from tests.fakes.discord_fixtures import (
    MANAGE_GUILD,
    is_ephemeral,
    restores_discord_endpoints,  # noqa: F401 (fixture)
    running,
)
from tests.fakes.discord_server import FakeDiscord, FakeUser
from tests.fakes.slack_server import FakeSlack
from tests.fakes.slack_server import FakeUser as SlackUser
from tests.integration.conftest import make_settings
from tests.integration.forget_scenario import (
    AGAINST,
    CHAT,
    FOR,
    TOKEN,
    MemberData,
    Role,
    assert_nothing_left,
    assert_same_opinions_rebased,
    differs_somewhere,
    files_holding,
    member_data,
    no_automatic_reflection,  # noqa: F401 (fixture)
    play,
    sqlite_files,
    teach,
)
from tests.integration.test_discord_e2e import WAIT, World, mention, settle, slash
from tests.integration.test_slack_e2e import slack_bot, slack_settings
from tests.slack.conftest import fake_slack, http_session  # noqa: F401 (fixtures)

pytestmark = pytest.mark.usefixtures("no_automatic_reflection")

ZORB = "Zorbalicia"  # the member who argues FOR, then asks to be forgotten


# ------------------------------------------------------------------------- terminal

TERMINAL_NAMES = {FOR: ZORB, AGAINST: "Bobbington", CHAT: "Carolyne"}


@contextlib.asynccontextmanager
async def terminal(data_dir: Path, llm: AnthropicLLM) -> AsyncIterator[tuple[Runtime, Lines]]:
    """A runtime with its terminal adapter, fed lines as a script would (one answer
    line out per line in)."""
    settings = make_settings(data_dir)
    async with open_runtime(settings, llm=llm) as runtime:
        out = io.StringIO()
        adapter = TerminalAdapter(runtime, settings, stdin=io.StringIO(), stdout=out)

        async def lines(*typed: str) -> list[str]:
            start = len(out.getvalue())
            for line in typed:
                assert await adapter.handle_line(line)
            await runtime.drain()
            return out.getvalue()[start:].splitlines()

        yield runtime, lines


Lines = Callable[..., Awaitable[list[str]]]


async def test_forget_me_at_the_terminal(
    tmp_path: Path, llm: AnthropicLLM, anthropic_server: AnthropicFake
) -> None:
    teach(anthropic_server.brain)
    member = f"terminal-{ZORB.lower()}"
    needles = [TOKEN, member, ZORB]
    # The community that never heard the FOR member: a terminal of its own.
    async with terminal(tmp_path / "fresh", llm) as (runtime, lines):

        async def say_fresh(community: str, role: Role, text: str) -> None:
            if community == "fresh":
                await lines(f"/as {TERMINAL_NAMES[role]}", text)

        await play(say_fresh, "whole", "fresh")
        never_heard = (await runtime.registry.agent_for(TERMINAL)).sponge
    settings = make_settings(tmp_path / "whole")
    async with terminal(tmp_path / "whole", llm) as (runtime, lines):

        async def say(community: str, role: Role, text: str) -> None:
            if community == "whole":
                await lines(f"/as {TERMINAL_NAMES[role]}", text)

        await play(say, "whole", "fresh")
        assert files_holding(sqlite_files(settings.resolved_database_path), needles)
        agent = await runtime.registry.agent_for(TERMINAL)
        others = {
            r: await _data(runtime, TERMINAL.id, f"terminal-{TERMINAL_NAMES[r].lower()}")
            for r in (AGAINST, CHAT)
        }
        heard_all = agent.sponge

        await lines(f"/as {ZORB}")
        # The terminal saves a my-data export in the data directory, which holds their
        # words, and a timeline picture, which shows their name.
        [exported] = await lines("/sonality my-data")
        assert files_holding([Path(exported)], [TOKEN])
        [picture] = await lines("/sonality timeline")
        assert picture.endswith(".png")
        [asked] = await lines("/sonality forget-me")
        assert "forget-me confirm" in asked and agent.sponge == heard_all
        since = len(anthropic_server.requests)
        [done] = await lines("/sonality forget-me confirm")
        assert done.startswith("Forgotten")
        assert "Deleted 2 saved my-data or timeline file(s)" in done
        assert not await asyncio.to_thread(Path(exported).exists)
        assert not await asyncio.to_thread(Path(picture).exists)

        assert_same_opinions_rebased(agent.sponge, never_heard)
        assert differs_somewhere(agent.sponge, heard_all)
        for role, before in others.items():
            who = f"terminal-{TERMINAL_NAMES[role].lower()}"
            assert await _data(runtime, TERMINAL.id, who) == before
        await say("whole", AGAINST, "What do you make of remote work now?")
        await say("whole", CHAT, "Any plans for the weekend?")
        await lines("/sonality reflect")
        await assert_reflected(runtime, TERMINAL.id)
        await agent.flush_episodes()
        assert_nothing_left(
            settings.resolved_database_path,
            settings.resolved_chroma_dir,
            anthropic_server.requests[since:],
            needles,
        )
    assert_nothing_left(settings.resolved_database_path, settings.resolved_chroma_dir, [], needles)
    assert files_holding([tmp_path / "whole"], needles) == []  # every file the bot keeps


# -------------------------------------------------------------------------- Discord

DISCORD_USERS = {
    FOR: FakeUser(731482659012345678, "zorb", ZORB),
    AGAINST: FakeUser(731482659012345679, "bobb", "Bobbington"),
    CHAT: FakeUser(731482659012345680, "carol", "Carolyne"),
}


@contextlib.asynccontextmanager
async def discord_world(
    data_dir: Path,
    llm: AnthropicLLM,
    anthropic: AnthropicFake,
    people: Sequence[FakeUser] = tuple(DISCORD_USERS.values()),
) -> AsyncIterator[World]:
    """Two servers with the same members (`people`, the first of them the World's
    member) and a moderator (the world of test_discord_e2e.py, with members of its own)."""
    moderator = FakeUser(731482659012345681, "mod", "Mo")
    fake = FakeDiscord()
    members = [*people, moderator]
    guild_a = fake.add_guild("Whole", members=members)
    guild_b = fake.add_guild("Fresh", members=members)
    await fake.start()
    settings = make_settings(
        data_dir,
        DISCORD_TOKEN="test-token",
        DISCORD_API_BASE_URL=fake.api_base,
        DISCORD_GATEWAY_URL=fake.gateway_url,
    )
    try:
        async with (
            open_runtime(settings, llm=llm) as runtime,
            running(runtime, settings, ready_within=WAIT) as adapter,
        ):
            yield World(fake, runtime, adapter, anthropic, guild_a, guild_b, people[0], moderator)
    finally:
        await fake.close()


async def test_forget_me_on_discord(
    tmp_path: Path, llm: AnthropicLLM, anthropic_server: AnthropicFake
) -> None:
    teach(anthropic_server.brain)
    settings = make_settings(tmp_path / "data")
    zorb = DISCORD_USERS[FOR]
    needles = [TOKEN, str(zorb.id), ZORB]
    async with discord_world(tmp_path / "data", llm, anthropic_server) as world:
        whole, fresh = World.community(world.guild_a), World.community(world.guild_b)
        guilds = {whole: world.guild_a, fresh: world.guild_b}

        async def say(community: str, role: Role, text: str) -> None:
            await mention(world, guilds[community], text, author=DISCORD_USERS[role])

        await play(say, whole, fresh)
        assert files_holding(sqlite_files(settings.resolved_database_path), needles)
        others = {
            r: await _data(world.runtime, whole, str(DISCORD_USERS[r].id)) for r in (AGAINST, CHAT)
        }
        agent = world.agent(world.guild_a)
        heard_all = agent.sponge

        callback, asked = await slash(world, world.guild_a, "forget-me", user=zorb)
        assert "Press Confirm" in asked.json["content"]
        assert is_ephemeral(callback) and agent.sponge == heard_all
        question = world.fake.interactions[callback.path.split("/")[3]].message
        assert question is not None
        since = len(anthropic_server.requests)
        _, token = await world.fake.press(
            guild=world.guild_a, user=zorb, message=question, label="Confirm"
        )
        original = f"/webhooks/{world.fake.application_id}/{token}/messages/@original"
        [done] = await world.fake.wait_for(
            lambda r: r.method == "PATCH" and r.path == original, seconds=WAIT
        )
        await settle(world)
        assert "Forgotten" in done.json["content"]

        assert_same_opinions_rebased(agent.sponge, world.agent(world.guild_b).sponge)
        assert differs_somewhere(agent.sponge, heard_all)
        for role, before in others.items():
            assert await _data(world.runtime, whole, str(DISCORD_USERS[role].id)) == before
        await say(whole, AGAINST, "What do you make of remote work now?")
        await say(whole, CHAT, "Any plans for the weekend?")
        await slash(world, world.guild_a, "reflect", permissions=MANAGE_GUILD, user=world.moderator)
        await assert_reflected(world.runtime, whole)
        await agent.flush_episodes()
        assert_nothing_left(
            settings.resolved_database_path,
            settings.resolved_chroma_dir,
            anthropic_server.requests[since:],
            needles,
        )
    assert_nothing_left(settings.resolved_database_path, settings.resolved_chroma_dir, [], needles)


# ---------------------------------------------------------------------------- Slack

SLACK_IDS = {FOR: "UZORB7Q4K1", AGAINST: "UBOBX3M8P2", CHAT: "UCARL5T6W9"}


async def test_forget_me_on_slack(
    tmp_path: Path,
    llm: AnthropicLLM,
    fake: FakeSlack,
    http: aiohttp.ClientSession,
    anthropic_server: AnthropicFake,
) -> None:
    fake.users.update(
        {
            SLACK_IDS[FOR]: SlackUser(SLACK_IDS[FOR], ZORB),
            SLACK_IDS[AGAINST]: SlackUser(SLACK_IDS[AGAINST], "Bobbington"),
            SLACK_IDS[CHAT]: SlackUser(SLACK_IDS[CHAT], "Carolyne"),
        }
    )
    teach(anthropic_server.brain)
    settings = slack_settings(tmp_path / "data", fake)
    whole, fresh = "slack:T1", "slack:T2"
    needles = [TOKEN, SLACK_IDS[FOR], ZORB]
    async with slack_bot(settings, llm, fake, http) as bot:

        async def say(community: str, role: Role, text: str) -> None:
            team = community.removeprefix("slack:")
            await bot.mention(f"<@UBOT> {text}", team=team, user=SLACK_IDS[role])

        await play(say, whole, fresh)
        assert files_holding(sqlite_files(settings.resolved_database_path), needles)
        others = {r: await _data(bot.runtime, whole, SLACK_IDS[r]) for r in (AGAINST, CHAT)}
        heard_all = (await bot.agent(whole)).sponge

        asked = await bot.command("forget-me", user=SLACK_IDS[FOR])
        # It asks (with Confirm / Cancel buttons here); typing `confirm` goes ahead too.
        assert asked["response_type"] == "ephemeral" and "confirm" in asked["text"].lower()
        assert (await bot.agent(whole)).sponge == heard_all  # nothing without confirm
        since = len(anthropic_server.requests)
        done = await bot.command("forget-me confirm", user=SLACK_IDS[FOR])
        assert done["response_type"] == "ephemeral" and "Forgotten" in done["text"]

        forgot, never_heard = (await bot.agent(whole)).sponge, (await bot.agent(fresh)).sponge
        assert_same_opinions_rebased(forgot, never_heard)
        assert differs_somewhere(forgot, heard_all)
        for role, before in others.items():
            assert await _data(bot.runtime, whole, SLACK_IDS[role]) == before
        # Later prompts: the others keep talking, and a reflection rewrites the narrative.
        await say(whole, AGAINST, "What do you make of remote work now?")
        await say(whole, CHAT, "Any plans for the weekend?")
        await bot.command("reflect", user="UADMIN")
        await assert_reflected(bot.runtime, whole)
        await (await bot.agent(whole)).flush_episodes()
        assert_nothing_left(
            settings.resolved_database_path,
            settings.resolved_chroma_dir,
            anthropic_server.requests[since:],
            needles,
        )
    # And at rest, once everything is closed.
    assert_nothing_left(settings.resolved_database_path, settings.resolved_chroma_dir, [], needles)


async def assert_reflected(runtime: Runtime, community: str) -> None:
    """The moderator's reflection ran (its prompt is among the requests scanned)."""
    [latest] = await runtime.db.community(community).versions(limit=1)
    assert latest.cause == "reflection", latest


async def _data(runtime: Runtime, community: str, member: str) -> MemberData:
    agent = runtime.registry.get(community)
    assert agent is not None
    return await member_data(runtime.db, agent, community, member)
