"""The Slack app uninstalled (or its bot token revoked) and installed again, end to end:
signed Events API requests into the real Bolt app, the real runtime behind it.

The removal bookkeeping and the scheduler's housekeeping run on the test's clock, so
"30 days later" takes no time.
"""

# `bot`, `fake` and `http` are fixtures imported from the Slack tests and taken by name.
# ruff: noqa: F811

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

import aiohttp
import pytest

from app.wiring import open_runtime
from bot.interface import StartupError
from bot.scheduler import ReflectionScheduler
from providers.anthropic import AnthropicLLM
from tests.fakes.anthropic_server import AnthropicFake
from tests.fakes.slack_server import FakeSlack, app_uninstalled_event, tokens_revoked_event
from tests.integration.test_removal_discord import Clock, rows_of
from tests.integration.test_slack_e2e import (  # noqa: F401
    T1,
    T2,
    TOPIC,
    SlackBot,
    bot,
    slack_bot,
    slack_settings,
)
from tests.slack.conftest import fake_slack, http_session  # noqa: F401

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


async def until(condition: Callable[[], bool], seconds: float = 10.0) -> None:
    """Poll: Bolt acks first and runs the listener afterwards."""
    async with asyncio.timeout(seconds):
        while not condition():  # noqa: ASYNC110
            await asyncio.sleep(0.01)


def setup(bot: SlackBot) -> tuple[Clock, ReflectionScheduler]:
    clock = Clock()
    bot.runtime.removals.clock = clock
    return clock, ReflectionScheduler(bot.runtime, clock=clock)


async def test_uninstalled_then_reinstalled_before_the_deadline_keeps_everything(
    bot: SlackBot, fake: FakeSlack, anthropic_server: AnthropicFake
) -> None:
    clock, scheduler = setup(bot)
    await bot.teach_canary(anthropic_server)
    before = rows_of(bot.runtime.db.path, T1)

    status, _ = await bot.deliver(app_uninstalled_event(team="T1", event_id="EvGone1"))
    assert status == 200
    await until(lambda: bot.runtime.removals.is_removed(T1))
    # Slack often sends tokens_revoked too: the deadline does not move.
    clock.now = T0 + timedelta(days=5)
    revoked = tokens_revoked_event(team="T1", event_id="EvGone2", bot=["UBOT"])
    assert (await bot.deliver(revoked))[0] == 200
    await fake.settle(quiet=0.1)
    [removal] = await bot.runtime.db.removals()
    assert removal.delete_at == T0 + timedelta(days=30)

    clock.now = T0 + timedelta(days=29)
    reply = await bot.mention("<@UBOT> we installed you again")  # an event from the team
    assert reply["text"]
    assert not bot.runtime.removals.is_removed(T1)
    await scheduler.run_housekeeping(T0 + timedelta(days=31))
    assert rows_of(bot.runtime.db.path, T1)["personality_versions"] > 0
    assert rows_of(bot.runtime.db.path, T1)["interactions"] == before["interactions"] + 1
    assert TOPIC in (await bot.agent(T1)).sponge.opinion_vectors


async def test_uninstalled_past_the_deadline_is_erased_and_starts_fresh(
    bot: SlackBot, fake: FakeSlack, anthropic_server: AnthropicFake
) -> None:
    clock, scheduler = setup(bot)
    await bot.teach_canary(anthropic_server)
    await bot.mention("<@UBOT> hello from the other workspace", team="T2", user="U2")
    kept = rows_of(bot.runtime.db.path, T2)

    # Only users' tokens revoked: the bot stays.
    user_only = tokens_revoked_event(team="T1", event_id="EvUser", oauth=["U1"])
    assert (await bot.deliver(user_only))[0] == 200
    await fake.settle(quiet=0.1)
    assert not bot.runtime.removals.is_removed(T1)

    revoked = tokens_revoked_event(team="T1", event_id="EvBot", bot=["UBOT"])
    assert (await bot.deliver(revoked))[0] == 200
    await until(lambda: bot.runtime.removals.is_removed(T1))
    await scheduler.run_housekeeping(T0 + timedelta(days=30))
    assert not any(rows_of(bot.runtime.db.path, T1).values())
    assert rows_of(bot.runtime.db.path, T2) == kept

    clock.now = T0 + timedelta(days=40)
    await bot.mention("<@UBOT> hello again")
    agent = await bot.agent(T1)
    assert TOPIC not in agent.sponge.opinion_vectors
    assert agent.sponge.interaction_count == 1


async def test_a_token_revoked_while_the_bot_was_offline_starts_the_countdown(
    tmp_path: Path,
    llm: AnthropicLLM,
    fake: FakeSlack,
    http: aiohttp.ClientSession,
) -> None:
    """Slack never resends the app_uninstalled the bot missed; auth.test at the next
    start answers token_revoked, and that starts the removal countdown (a mistyped
    token, invalid_auth, only stops the start: test_misconfiguration_is_a_startup_error)."""
    settings = slack_settings(tmp_path / "data", fake)
    async with slack_bot(settings, llm, fake, http) as stack:
        await stack.mention("<@UBOT> hello")
    fake.failures["auth.test"] = "token_revoked"
    with pytest.raises(StartupError, match="token_revoked"):
        async with slack_bot(settings, llm, fake, http):
            pass
    async with open_runtime(settings, llm=llm) as runtime:
        assert [r.community_id for r in await runtime.db.removals()] == [T1]
        assert runtime.removals.is_removed(T1)
