"""Every place a command shows up agrees with the command table (bot/command_table.py).

One test per surface would let two surfaces agree with each other and not the table, so
`test_every_surface_shows_each_command_as_the_table_defines_it` reads all of them at
once: what discord.py registered with (the fake) Discord, the Slack manifest's usage
hint, `help` as the bot prints it, and the parsers of the terminal and Slack.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from bot.command_table import (
    COMMANDS,
    Access,
    Command,
    ParamType,
    help_entries,
    slack_usage_hint,
    split_command,
)
from bot.commands import HELP
from bot.messages import CommandResult
from bot.settings import Settings
from tests.fakes import discord_fixtures
from tests.fakes.discord_fixtures import restores_discord_endpoints  # noqa: F401
from tests.fakes.discord_server import FakeDiscord, FakeUser
from tests.fakes.recording_runtime import RecordingRuntime

ROOT = Path(__file__).resolve().parents[2]
MANIFEST = ROOT / "slack" / "manifest.yml"

#: Discord's option types (discord.AppCommandOptionType).
DISCORD_TYPE = {
    ParamType.NUMBER: 4,
    ParamType.VERSION: 4,
    ParamType.TOPIC: 3,
    ParamType.WORD: 3,
    ParamType.TEXT: 3,
    ParamType.MEMBER: 6,
    ParamType.FLAG: 5,
}

Shape = tuple[str, tuple[tuple[str, int, bool, Any, Any], ...], bool]


def table_shape(spec: Command) -> Shape:
    """What Discord should show of a command: its options (name, type, required,
    bounds) and whether its description says it is for moderators."""
    options = tuple(
        (p.name, DISCORD_TYPE[p.type], p.required, p.low, p.high)
        for p in spec.params
        if not p.text_only
    )
    return spec.name, options, spec.access is Access.MODERATORS


def registered_shape(sub: dict[str, Any]) -> Shape:
    options = tuple(
        (
            o["name"],
            o["type"],
            bool(o.get("required", False)),
            o.get("min_value"),
            o.get("max_value"),
        )
        for o in sub.get("options", [])
    )
    return sub["name"], options, str(sub["description"]).startswith("Moderators:")


@contextlib.asynccontextmanager
async def registered_group() -> AsyncIterator[dict[str, Any]]:
    """The /sonality group discord.py puts to Discord's API on start."""
    server = FakeDiscord()
    server.add_guild("Guild One", members=[FakeUser(9001, "alice", "Alice")])
    await server.start()
    runtime = RecordingRuntime(refusal="no", command_result=lambda r: CommandResult(text="ran"))
    settings = Settings(  # type: ignore[call-arg]
        _env_file=None,
        discord_token="test-token",
        discord_api_base_url=server.api_base,
        discord_gateway_url=server.gateway_url,
    )
    try:
        async with discord_fixtures.running(runtime, settings):
            pass
        [put] = server.find("PUT", "/commands")
        [group] = put.json
        yield group
    finally:
        await server.close()


def help_shape() -> dict[str, bool]:
    """`help` as printed: each line's usage and whether it is for moderators."""
    shown: dict[str, bool] = {}
    for line in HELP.splitlines():
        if line.startswith("/sonality "):
            usage, _, what = line.removeprefix("/sonality ").partition("  ")
            shown[usage.strip()] = what.strip().startswith("moderators:")
    return shown


def manifest_hint() -> str:
    manifest = yaml.safe_load(MANIFEST.read_text())
    [command] = manifest["features"]["slash_commands"]
    return str(command["usage_hint"])


async def test_every_surface_shows_each_command_as_the_table_defines_it() -> None:
    async with registered_group() as group:
        registered = {o["name"]: registered_shape(o) for o in group["options"]}
    assert registered == {c.name: table_shape(c) for c in COMMANDS}

    assert help_shape() == {usage: what.startswith("moderators:") for usage, what in help_entries()}
    for spec in COMMANDS:
        assert spec.usage() in help_shape() or spec.access is Access.MODERATORS_TO_CHANGE

    assert manifest_hint() == slack_usage_hint()
    for spec in COMMANDS:
        assert split_command(spec.name)[0] == spec.name


async def test_a_drifted_surface_is_caught() -> None:
    """The comparison notices a missing option, a lost moderator rule and a stale hint."""
    async with registered_group() as group:
        subs = {o["name"]: o for o in group["options"]}
    history = dict(subs["history"], options=[])
    assert registered_shape(history) != table_shape(
        next(c for c in COMMANDS if c.name == "history")
    )
    reflect = dict(subs["reflect"], description="Reflect now")
    assert registered_shape(reflect) != table_shape(
        next(c for c in COMMANDS if c.name == "reflect")
    )
    assert slack_usage_hint().replace(" | forget-user <member> <reason>", "") != slack_usage_hint()


@pytest.mark.parametrize(
    ("typed", "expected"),
    [
        ("beliefs nuclear energy", ("beliefs", ("nuclear energy",))),
        ("rollback 3 undo the raid", ("rollback", ("3", "undo", "the", "raid"))),
        ("HISTORY all 5", ("history", ("all", "5"))),
        ("", ("help", ())),
    ],
)
def test_text_platforms_split_a_line_by_the_table(
    typed: str, expected: tuple[str, tuple[str, ...]]
) -> None:
    assert split_command(typed) == expected


def test_the_terminal_groups_quoted_words_and_slack_keeps_apostrophes() -> None:
    assert split_command('timeline "heat pumps" 30', quotes=True) == (
        "timeline",
        ("heat pumps", "30"),
    )
    assert split_command("forget-user Bob he's 'gone'") == (
        "forget-user",
        ("Bob", "he's", "'gone'"),
    )
