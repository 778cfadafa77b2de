"""Direct messages: private, and moderated by nobody unless the operator says so.

Issue 22, finding 7: with DMs allowed, every DM personality was its member's to
moderate, so anyone could DM the bot `/sonality budget off` and spend without the
operator's SONALITY_DAILY_BUDGET_USD. Finding 8: Slack DMs fed the workspace's shared
personality, so one member's private words came back in another's answer. Driven end
to end: real discord.py and slack-bolt against the fake Discord and Slack (DM
interactions and message.im events as the platforms send them), the runtime from
`open_runtime`, the anthropic SDK against its fake.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from bot.messages import Community
from bot.runtime import Runtime
from tests.fakes.anthropic_server import AnthropicFake
from tests.fakes.discord_fixtures import (
    MANAGE_GUILD,
    is_ephemeral,
    restores_discord_endpoints,  # noqa: F401
)
from tests.fakes.discord_server import FakeChannel, RecordedRequest
from tests.fakes.slack_server import FakeSlack, app_uninstalled_event, post_signed
from tests.integration.conftest import ALICE, A, chat_requests, command, prompt_of, say
from tests.integration.test_discord_e2e import World, discord_world, slash
from tests.integration.test_slack_e2e import SlackBot, slack_bot, slack_settings
from tests.slack.conftest import (  # noqa: F401  (fixtures "fake", "http")
    SECRET,
    adapter_url,
    command_form,
    fake_slack,
    http_session,
    mention_event,
)

DEFAULT_LIMIT = 0.5


def dm_world(
    tmp_path: Path, llm: Any, anthropic: AnthropicFake, **settings: Any
) -> contextlib.AbstractAsyncContextManager[World]:
    """Discord with DMs allowed and an operator's daily limit."""
    return discord_world(
        tmp_path,
        llm,
        anthropic,
        DISCORD_ALLOW_DMS=True,
        SONALITY_DAILY_BUDGET_USD=DEFAULT_LIMIT,
        **settings,
    )


async def dm_slash(
    world: World,
    dm: FakeChannel,
    subcommand: str,
    options: list[dict[str, Any]] | None = None,
    *,
    permissions: int = 0,
) -> tuple[RecordedRequest, RecordedRequest]:
    """/sonality <subcommand> in the member's DM with the bot; (callback, PATCH @original)."""
    return await slash(
        world, None, subcommand, options=options, permissions=permissions, channel=dm
    )


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


# --------------------------------------------------------------------------------------
# Slack: a DM with the bot is the member's own personality (finding 8), moderated by
# nobody unless the operator allows it (finding 7)

SECRET_WORD = "zebrafishsyndrome"


@pytest.fixture
async def dm_bot(
    tmp_path: Path, llm: Any, fake: FakeSlack, http: aiohttp.ClientSession
) -> AsyncIterator[SlackBot]:
    """Slack with DMs allowed and an operator's daily limit; U1 and UADMIN each have
    their DM with the bot."""
    fake.dms.update({"U1": "D0001", "UADMIN": "D0002"})
    settings = slack_settings(
        tmp_path / "data", fake, SLACK_ALLOW_DMS=True, SONALITY_DAILY_BUDGET_USD=DEFAULT_LIMIT
    )
    async with slack_bot(settings, llm, fake, http) as bot:
        yield bot


async def slack_dm(bot: SlackBot, text: str, *, user: str = "U1", channel: str = "D0001") -> str:
    """A message in `user`'s DM with the bot (message.im); waits for the reply there.
    Returns the message's ts."""
    ts = bot.next_ts()
    before = len(bot.fake.posts())
    body = mention_event(
        event_id=f"Ev{ts}", team="T1", user=user, channel=channel, ts=ts, text=text
    )
    body["event"].update(type="message", channel_type="im")
    status, _ = await bot.deliver(body)
    assert status == 200
    await bot.fake.wait_for(lambda: len(bot.fake.posts()) > before, what=f"DM reply to {ts}")
    await bot.runtime.drain()
    assert [p["channel"] for p in bot.fake.posts()[before:]] == [channel]
    return ts


async def slack_dm_command(
    bot: SlackBot, text: str, *, user: str = "U1", channel: str = "D0001"
) -> dict[str, Any]:
    """/sonality `text` typed in a DM channel; the single ephemeral or public answer."""
    rid = f"r{len(bot.fake.responses) + 1}"
    form = command_form(bot.fake, text, user=user, team="T1", rid=rid)
    form.update(channel_id=channel, channel_name="directmessage")
    status, _, _ = await post_signed(bot.http, adapter_url(bot.adapter), SECRET, form=form)
    assert status == 200
    await bot.fake.wait_for(lambda: bot.fake.responses.get(rid), what=f"/sonality {text}")
    await bot.fake.settle(quiet=0.1)
    [answer] = bot.fake.responses[rid]
    return answer


async def test_a_slack_dm_never_reaches_the_workspace_personality(
    dm_bot: SlackBot, anthropic_server: AnthropicFake
) -> None:
    bot = dm_bot
    anthropic_server.brain.ess_rule(
        contains=SECRET_WORD,
        score=0.6,
        direction="supports",
        topics=["health"],
        summary=f"The sender says a doctor diagnosed {SECRET_WORD}.",
    )
    await slack_dm(bot, f"my doctor says I have {SECRET_WORD}")
    await bot.mention("<@UBOT> did a doctor diagnose anyone here with a syndrome?", user="U2")
    asked_in_public = prompt_of(chat_requests(anthropic_server)[-1])
    assert "diagnose anyone here" in asked_in_public
    assert SECRET_WORD not in asked_in_public

    # The DM's own personality does remember it (so the check above could fail).
    await slack_dm(bot, "what did my doctor say about syndromes?")
    assert SECRET_WORD in prompt_of(chat_requests(anthropic_server)[-1])
    workspace = await bot.agent("slack:T1")
    private = await bot.agent("slack:T1:dm:U1")
    assert workspace.sponge.interaction_count == 1
    assert private.sponge.interaction_count == 2

    # The workspace's /sonality knows nothing of it; the DM's does.
    public = await bot.command("beliefs", team="T1", user="U2")
    assert "health" not in public["text"] and "no beliefs" in public["text"]
    in_dm = await slack_dm_command(bot, "beliefs")
    assert "health" in in_dm["text"], in_dm


async def test_slack_dm_commands_moderate_nothing_unless_the_operator_allows(
    dm_bot: SlackBot,
) -> None:
    bot = dm_bot
    ledger = bot.runtime.budget
    for user, channel in (("U1", "D0001"), ("UADMIN", "D0002")):
        for wish in ("off", "1000000"):
            answer = await slack_dm_command(bot, f"budget {wish}", user=user, channel=channel)
            assert "Only moderators" in answer["text"], (user, wish)
            limit = await ledger.limit(f"slack:T1:dm:{user}")
            assert (limit.usd, limit.source) == (DEFAULT_LIMIT, "default")
        shown = await slack_dm_command(bot, "budget", user=user, channel=channel)
        assert "$0.50" in shown["text"], shown
    assert (await ledger.limit("slack:T1")).usd == DEFAULT_LIMIT
    # A workspace admin still moderates the workspace, from any channel of it.
    done = await bot.command("budget 3", team="T1", user="UADMIN")
    assert "Only moderators" not in done["text"]
    assert (await ledger.limit("slack:T1")).usd == 3.0


async def test_uninstalling_the_slack_app_takes_its_dm_personalities_along(
    dm_bot: SlackBot,
) -> None:
    bot = dm_bot
    await slack_dm(bot, "hello in private")
    removals = bot.runtime.removals
    status, _ = await bot.deliver(app_uninstalled_event(team="T1", event_id="EvGone"))
    assert status == 200
    async with asyncio.timeout(10):
        while not removals.is_removed("slack:T1:dm:U1"):  # noqa: ASYNC110
            await asyncio.sleep(0.01)
    assert removals.is_removed("slack:T1")
    # Installed again: the member's next DM brings their DM personality back.
    await slack_dm(bot, "are you back?")
    assert not removals.is_removed("slack:T1:dm:U1")
    assert not removals.is_removed("slack:T1")
    assert (await bot.agent("slack:T1:dm:U1")).sponge.interaction_count == 2


async def test_no_moderator_command_runs_in_a_dm_whatever_the_adapter_says(
    runtime: Runtime,
) -> None:
    """The runtime's own check, for any platform's DM (an adapter that forgot the rule)."""
    dm = Community(id="slack:T1:dm:U9", name="DM with Ivy")
    await say(runtime, "hello in private", community=dm, user=ALICE)
    for name, *args in (
        ("forget-user", ALICE.id, "she asked"),
        ("budget", "off"),
        ("reflect",),
        ("rollback", "0"),
    ):
        refused = await command(runtime, name, *args, community=dm, moderator=True)
        assert not refused.ok and "Only moderators" in refused.text, name
    assert (await runtime.registry.agent_for(dm)).sponge.interaction_count == 1
    allowed = await command(runtime, "budget", "2", community=A, moderator=True)
    assert allowed.ok, allowed.text
