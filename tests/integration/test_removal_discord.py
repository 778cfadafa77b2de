"""The bot kicked from a Discord server and invited back, end to end through discord.py.

GUILD_DELETE / GUILD_CREATE come from the fake gateway in their real shapes; the clock
of the removal bookkeeping and of the scheduler's housekeeping is the test's, so "30
days later" takes no time.
"""

# The `world` fixture is imported from the Discord end-to-end tests and taken by name.
# ruff: noqa: F811

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

from app.wiring import open_runtime
from bot.messages import Community, IncomingMessage, User
from bot.scheduler import ReflectionScheduler
from providers.anthropic import AnthropicLLM
from tests.fakes.anthropic_server import AnthropicFake
from tests.fakes.discord_fixtures import MANAGE_GUILD, running
from tests.fakes.discord_server import FakeDiscord, FakeUser
from tests.integration.conftest import make_settings
from tests.integration.discord_guild import slash
from tests.integration.forget_scenario import files_holding
from tests.integration.test_discord_e2e import (  # noqa: F401
    TOPIC,
    World,
    mention,
    restores_discord_endpoints,
    teach_canary,
    world,
)
from tests.integration.test_isolation_and_commands import CANARY, CANARY_TEXT

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> datetime:
        return self.now


def rows_of(db_path: Path | None, community_id: str) -> dict[str, int]:
    """Rows per table that belong to the community (plain sqlite3, read-only)."""
    assert db_path is not None, "this check reads the SQLite file (the default storage)"
    uri = f"file:{db_path}?mode=ro"
    with contextlib.closing(sqlite3.connect(uri, uri=True)) as conn:
        tables = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")]
        out = {}
        for table in tables:
            columns = [c[1] for c in conn.execute(f'PRAGMA table_info("{table}")')]
            column = "id" if table == "communities" else "community_id"
            if column in columns and table != "community_erasures":
                query = f'SELECT COUNT(*) FROM "{table}" WHERE "{column}" = ?'
                out[table] = int(conn.execute(query, (community_id,)).fetchone()[0])
        return out


async def until(condition: Callable[[], bool], seconds: float = 10.0) -> None:
    """Poll: the gateway event reaches the runtime through discord.py's own tasks."""
    async with asyncio.timeout(seconds):
        while not condition():  # noqa: ASYNC110
            await asyncio.sleep(0.01)


def setup(world: World) -> tuple[Clock, ReflectionScheduler, str]:
    clock = Clock()
    world.runtime.removals.clock = clock
    return clock, ReflectionScheduler(world.runtime, clock=clock), world.community(world.guild_a)


async def answered_directly(world: World, community_id: str) -> bool:
    """Whether the runtime would answer a message in the community right now (a
    message already on its way when the kick arrived, say)."""
    message = IncomingMessage(
        community=Community(id=community_id, name="Guild A"),
        channel_id="1",
        user=User(id="9001", name="Alice"),
        text="hello?",
    )
    return await world.runtime.handle(message) is not None


async def test_kicked_then_invited_back_before_the_deadline_keeps_everything(
    world: World,
) -> None:
    clock, scheduler, gone = setup(world)
    await teach_canary(world)
    await mention(world, world.guild_b, "hello from B")
    db_path = world.runtime.db.path
    assert db_path is not None
    await world.agent(world.guild_a).flush_episodes()
    summary = str(CANARY["summary"])
    assert files_holding([db_path.parent / "chromadb"], [summary])  # the scan can fail
    before = rows_of(db_path, gone)
    assert before["personality_versions"] == 5

    await world.fake.remove_bot(world.guild_a)
    await until(lambda: world.runtime.removals.is_removed(gone))
    assert world.runtime.registry.get(gone) is None  # its agent is closed at once
    assert not await answered_directly(world, gone)  # silent there from now on

    clock.now = T0 + timedelta(days=29)
    await world.fake.add_bot(world.guild_a)
    await until(lambda: not world.runtime.removals.is_removed(gone))

    await scheduler.run_housekeeping(T0 + timedelta(days=31))
    assert rows_of(db_path, gone)["personality_versions"] == before["personality_versions"]
    _, posts = await mention(world, world.guild_a, "still remember me?")
    assert len(posts) == 1
    agent = world.agent(world.guild_a)
    assert agent.sponge.opinion_vectors.get(TOPIC, 0) > 0  # the personality came back whole


async def test_kicked_and_back_after_the_deadline_starts_from_the_seed(world: World) -> None:
    clock, scheduler, gone = setup(world)
    await teach_canary(world)
    await mention(world, world.guild_b, "hello from B")
    db_path = world.runtime.db.path
    assert db_path is not None
    await world.agent(world.guild_a).flush_episodes()
    summary = str(CANARY["summary"])
    assert files_holding([db_path.parent / "chromadb"], [summary])  # the scan can fail
    kept = rows_of(db_path, world.community(world.guild_b))
    memories_b = world.agent(world.guild_b).episodes
    assert world.agent(world.guild_a).episodes.count() > 0
    assert memories_b.count() > 0

    await world.fake.remove_bot(world.guild_a)
    await until(lambda: world.runtime.removals.is_removed(gone))
    await scheduler.run_housekeeping(T0 + timedelta(days=30) - timedelta(seconds=1))
    assert rows_of(db_path, gone)["personality_versions"] == 5  # not yet

    await scheduler.run_housekeeping(T0 + timedelta(days=30))
    assert not any(rows_of(db_path, gone).values()), rows_of(db_path, gone)
    memory = world.runtime.memory
    assert memory is not None
    # Its collections are gone already: dropping them again finds none.
    assert await asyncio.to_thread(memory.drop_community, gone) == 0
    assert memories_b.count() > 0
    assert rows_of(db_path, world.community(world.guild_b)) == kept
    # Nothing of it in any file of the data directory, Chroma's included.
    summary = str(CANARY["summary"])
    assert files_holding([db_path.parent], [CANARY_TEXT, summary]) == []

    clock.now = T0 + timedelta(days=31)
    await world.fake.add_bot(world.guild_a)
    await until(lambda: not world.runtime.removals.is_removed(gone))
    _, posts = await mention(world, world.guild_a, "hello again")
    assert len(posts) == 1
    agent = world.agent(world.guild_a)
    assert TOPIC not in agent.sponge.opinion_vectors
    assert agent.sponge.interaction_count == 1  # a fresh start from the seed


async def test_an_outage_is_not_a_removal(world: World) -> None:
    _, _, community = setup(world)
    await mention(world, world.guild_a, "hi")
    await world.fake.guild_outage(world.guild_a)
    await asyncio.sleep(0.2)
    assert not world.runtime.removals.is_removed(community)
    assert await world.runtime.db.removals() == []


async def test_a_kick_while_the_bot_was_offline_is_noticed_at_the_next_connect(
    tmp_path: Path, llm: AnthropicLLM, anthropic_server: AnthropicFake
) -> None:
    """Discord never repeats the GUILD_DELETE the bot missed; READY at the next connect
    no longer lists the guild, and that starts the removal countdown (an outage, where
    READY lists the guild as unavailable, does not: test_an_outage_is_not_a_removal)."""
    member, moderator = FakeUser(9001, "alice", "Alice"), FakeUser(9002, "mod", "Mo")
    fake = FakeDiscord()
    kept = fake.add_guild("Kept", members=[member, moderator])
    left = fake.add_guild("Left", members=[member, moderator])
    await fake.start()
    settings = make_settings(
        tmp_path / "data",
        DISCORD_TOKEN="test-token",
        DISCORD_API_BASE_URL=fake.api_base,
        DISCORD_GATEWAY_URL=fake.gateway_url,
    )
    try:
        async with open_runtime(settings, llm=llm) as runtime:
            async with running(runtime, settings) as adapter:
                world = World(
                    fake, runtime, adapter, anthropic_server, kept, left, member, moderator
                )
                await mention(world, kept, "hello")
                await mention(world, left, "hello")
            fake.guilds.remove(left)  # kicked while the bot was not connected
            async with running(runtime, settings):
                await until(lambda: runtime.removals.is_removed(World.community(left)))
                assert not runtime.removals.is_removed(World.community(kept))
                async with asyncio.timeout(10):  # recorded right after it goes silent
                    while not (removals := await runtime.db.removals()):  # noqa: ASYNC110
                        await asyncio.sleep(0.01)
                assert [r.community_id for r in removals] == [World.community(left)]
    finally:
        await fake.close()


async def test_commands_from_a_guild_the_bot_left_neither_show_nor_change_anything(
    world: World,
) -> None:
    """A client's cached command list (or the command integration, which outlives the
    bot user) can still send `/sonality` from a guild the bot left. Nothing of the
    community is shown, changed, or loaded again; the caller is told privately."""
    await teach_canary(world)
    gone = world.community(world.guild_a)
    store = world.runtime.db.community(gone)
    await world.fake.remove_bot(world.guild_a)
    await until(lambda: world.runtime.removals.is_removed(gone))
    versions = await store.versions(limit=100)

    looked, private = await slash(world.fake, world.guild_a, world.member, "beliefs")
    assert private and "no longer part of this community" in looked and TOPIC not in looked
    version_0 = [{"name": "version", "type": 4, "value": 0}]
    rolled, _ = await slash(
        world.fake, world.guild_a, world.moderator, "rollback", MANAGE_GUILD, options=version_0
    )
    assert "no longer part of this community" in rolled
    assert await store.versions(limit=100) == versions
    assert world.runtime.registry.get(gone) is None
