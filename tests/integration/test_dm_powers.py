"""Who moderates a direct message: nobody, unless the operator says so.

Issue 22, finding 7: with DMs allowed, every DM personality was its member's to
moderate, so anyone could DM the bot `/sonality budget off` and spend without the
operator's SONALITY_DAILY_BUDGET_USD. Driven end to end: real discord.py against the
fake Discord (a DM interaction as Discord sends it), the runtime from `open_runtime`,
the anthropic SDK against its fake.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from bot.app import open_runtime
from tests.fakes.anthropic_server import AnthropicFake
from tests.fakes.discord_fixtures import (
    MANAGE_GUILD,
    is_ephemeral,
    restores_discord_endpoints,  # noqa: F401
    running,
)
from tests.fakes.discord_server import FakeChannel, FakeDiscord, FakeUser, RecordedRequest
from tests.integration.conftest import make_settings
from tests.integration.test_discord_e2e import WAIT, World, settle

DEFAULT_LIMIT = 0.5


@contextlib.asynccontextmanager
async def dm_world(
    tmp_path: Path, llm: Any, anthropic: AnthropicFake, **settings: Any
) -> AsyncIterator[World]:
    member = FakeUser(9001, "alice", "Alice")
    moderator = FakeUser(9002, "mod", "Mo")
    fake = FakeDiscord()
    guild_a = fake.add_guild("Guild A", members=[member, moderator])
    guild_b = fake.add_guild("Guild B", members=[member, moderator])
    await fake.start()
    config = make_settings(
        tmp_path / "data",
        DISCORD_TOKEN="test-token",
        DISCORD_API_BASE_URL=fake.api_base,
        DISCORD_GATEWAY_URL=fake.gateway_url,
        DISCORD_ALLOW_DMS=True,
        SONALITY_DAILY_BUDGET_USD=DEFAULT_LIMIT,
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


async def dm_slash(
    world: World,
    dm: FakeChannel,
    subcommand: str,
    options: list[dict[str, Any]] | None = None,
    *,
    permissions: int = 0,
) -> tuple[RecordedRequest, RecordedRequest]:
    """/sonality <subcommand> in the member's DM with the bot; (callback, PATCH @original)."""
    fake = world.fake
    iid, token = await fake.interaction_create(
        guild=None,
        channel=dm,
        user=world.member,
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
    return callback, patch


def amount(value: str) -> list[dict[str, Any]]:
    return [{"name": "amount", "type": 3, "value": value}]


async def test_a_dm_member_cannot_lift_the_operators_spending_limit(
    tmp_path: Path, llm: Any, anthropic_server: AnthropicFake
) -> None:
    async with dm_world(tmp_path, llm, anthropic_server) as world:
        dm = FakeChannel(world.fake.snowflake(), "dm")
        community = f"discord:dm:{world.member.id}"
        ledger = world.runtime.budget
        # An old release let the DM member set an own limit: it no longer counts.
        await world.runtime.db.set_budget_override(
            community, None, set_by="alice", at=ledger.clock()
        )
        for wish in ("off", "1000000", "default"):
            callback, patch = await dm_slash(world, dm, "budget", amount(wish))
            assert is_ephemeral(callback), wish
            assert "Only moderators" in patch.json["content"], wish
        for command in ("reflect", "rollback"):
            options = [{"name": "version", "type": 4, "value": 0}] if command == "rollback" else []
            _, patch = await dm_slash(world, dm, command, options, permissions=MANAGE_GUILD)
            assert "Only moderators" in patch.json["content"], command
        limit = await ledger.limit(community)
        assert (limit.usd, limit.source) == (DEFAULT_LIMIT, "default")
        actions = await world.runtime.db.moderator_actions(community)
        assert len(actions) == 5 and not any(a.allowed for a in actions)

        # What a member may do still works: look at the limit, read the beliefs.
        _, patch = await dm_slash(world, dm, "budget")
        assert "$0.50" in patch.json["content"], patch.json["content"]
        _, patch = await dm_slash(world, dm, "beliefs")
        assert "no beliefs" in patch.json["content"]


async def test_the_operator_may_let_dm_members_moderate_their_own_dm(
    tmp_path: Path, llm: Any, anthropic_server: AnthropicFake
) -> None:
    async with dm_world(tmp_path, llm, anthropic_server, SONALITY_DM_MODERATION=True) as world:
        dm = FakeChannel(world.fake.snowflake(), "dm")
        community = f"discord:dm:{world.member.id}"
        callback, patch = await dm_slash(world, dm, "budget", amount("2"))
        assert not is_ephemeral(callback)
        assert "Only moderators" not in patch.json["content"]
        limit = await world.runtime.budget.limit(community)
        assert (limit.usd, limit.source) == (2.0, "community")
        # A guild still follows its own roles: no Manage Server, no budget.
        guild_limit = await world.runtime.budget.limit(world.community(world.guild_a))
        assert guild_limit.usd == DEFAULT_LIMIT
