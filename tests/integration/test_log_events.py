"""One INFO line for each change to a personality an operator may have to account for:
a committed opinion move, a reflection, a rollback and each budget event, each naming
its community (in the text and, for JSON log lines, as the `community` field)."""

from __future__ import annotations

import logging

import pytest

from app.logs import COMMUNITY
from bot.runtime import Runtime
from tests.fakes.anthropic_server import AnthropicFake
from tests.integration.conftest import A, B, command, say
from tests.integration.test_isolation_and_commands import CANARY, teach_canary


def info_lines(caplog: pytest.LogCaptureFixture, needle: str) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.levelno == logging.INFO and needle in r.getMessage()]


async def test_an_opinion_commit_is_one_info_line_naming_the_community(
    runtime: Runtime, anthropic_server: AnthropicFake, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    anthropic_server.brain.ess_rule(**CANARY)
    await teach_canary(runtime)  # the staged move commits on the fourth message
    await say(runtime, "hello from elsewhere", community=B)

    [moved] = info_lines(caplog, "opinion moved")
    assert moved.name == "sonality.agent"
    assert getattr(moved, COMMUNITY) == A.id
    assert moved.getMessage().startswith(f"{A.id}: opinion moved (v4): canary_zebra_crossings +")
    assert not [r for r in caplog.records if getattr(r, COMMUNITY, None) == B.id]


async def test_reflection_rollback_and_budget_each_log_one_info_line(
    runtime: Runtime, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    await say(runtime, "hello")

    assert (await command(runtime, "reflect")).ok
    [reflected] = info_lines(caplog, "reflection (moderator)")
    assert getattr(reflected, COMMUNITY) == A.id and reflected.getMessage().startswith(A.id)
    assert reflected.getMessage().endswith("(v2)")

    assert (await command(runtime, "rollback", "1", "too early")).ok
    [rolled] = info_lines(caplog, "rollback in")
    assert getattr(rolled, COMMUNITY) == A.id
    assert rolled.getMessage() == f"rollback in {A.id} to v1 by {'u-alice'} (now v3)"

    assert (await command(runtime, "budget", "0.000001")).ok
    [limit] = info_lines(caplog, "daily limit in")
    assert getattr(limit, COMMUNITY) == A.id
    assert "$0.000001" not in limit.getMessage()  # the limit as people read it
    assert "<$0.001 a day (set for this community)" in limit.getMessage()

    await say(runtime, "are you still there?")  # today's spend is already past the limit
    await say(runtime, "and now?")
    [reached] = info_lines(caplog, "reached its daily limit")
    assert getattr(reached, COMMUNITY) == A.id
    assert reached.getMessage().startswith(f"community {A.id} reached its daily limit")
    [warned] = [r for r in caplog.records if "of its daily limit of" in r.getMessage()]
    assert warned.levelno == logging.WARNING and getattr(warned, COMMUNITY) == A.id
