"""The `/sonality` group Discord registers, made from the command table.

discord.py reads a slash command's options from its callback's signature, so each
subcommand gets one generic callback whose signature is written from the table's
parameters: a number becomes an integer option with its bounds, a member Discord's user
picker, a flag a true/false option, a topic or version an autocompleted option. No
option is written here by hand, so Discord cannot drift from `help` again.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Literal

import discord
from discord import app_commands

from bot.command_table import COMMANDS, Command, Param, ParamType

#: Runs a command: the interaction, the command's name and its arguments as text.
RunCommand = Callable[[discord.Interaction, str, Sequence[str]], Awaitable[None]]
#: Autocomplete: the interaction, what to complete and what was typed so far.
Choices = Callable[[discord.Interaction, Literal["version", "topic"], str], Awaitable[list[str]]]

_LEADING_NUMBER = re.compile(r"\s*(\d+)")


def build_group(*, allow_dms: bool, run: RunCommand, choices: Choices) -> app_commands.Group:
    """/sonality <sub>: visible to everyone, because most subcommands are for every
    member; moderator subcommands are enforced in code and say so in their description
    (an admin can still narrow who sees the command under Server Settings →
    Integrations). Installed to guilds only; DMs when the operator allows them."""
    group = app_commands.Group(
        name="sonality",
        description="This community's evolving personality",
        allowed_installs=app_commands.AppInstallationType(guild=True, user=False),
        allowed_contexts=app_commands.AppCommandContext(
            guild=True, dm_channel=allow_dms, private_channel=False
        ),
    )
    for spec in COMMANDS:
        group.add_command(_subcommand(spec, run, choices))
    return group


def discord_params(spec: Command) -> list[Param]:
    """The parameters Discord shows (forget-me's `confirm` is a button there)."""
    return [p for p in spec.params if not p.text_only]


def _annotation(param: Param) -> Any:
    kind: Any
    if param.type is ParamType.NUMBER:
        kind = app_commands.Range[int, param.low, param.high]
    elif param.type is ParamType.VERSION:
        kind = int
    elif param.type is ParamType.MEMBER:
        kind = discord.User
    elif param.type is ParamType.FLAG:
        kind = bool
    else:
        kind = str
    return kind if param.required else kind | None


def _as_text(params: Sequence[Param], values: dict[str, Any]) -> tuple[str, ...]:
    """Discord's typed values as the words a member would have typed."""
    words: list[str] = []
    for param in params:
        value = values.get(param.name)
        if value is None or value is False:
            continue
        if param.type is ParamType.FLAG:
            words.append(param.name)
        elif isinstance(value, discord.abc.User):
            words.append(str(value.id))
        else:
            words.append(str(value))
    return tuple(words)


def _subcommand(
    spec: Command, run: RunCommand, choices: Choices
) -> app_commands.Command[Any, ..., None]:
    params = discord_params(spec)

    async def callback(interaction: discord.Interaction, **values: Any) -> None:
        await run(interaction, spec.name, _as_text(params, values))

    callback.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
        [
            inspect.Parameter(
                "interaction",
                inspect.Parameter.POSITIONAL_OR_KEYWORD,
                annotation=discord.Interaction,
            ),
            *(
                inspect.Parameter(
                    p.name,
                    inspect.Parameter.KEYWORD_ONLY,
                    annotation=_annotation(p),
                    **({} if p.required else {"default": None}),
                )
                for p in params
            ),
        ]
    )
    if params:
        app_commands.describe(**{p.name: p.description for p in params})(callback)
    command: app_commands.Command[Any, ..., None] = app_commands.Command(
        name=spec.name, description=spec.discord_description, callback=callback
    )
    for param in params:
        if param.type is ParamType.TOPIC:
            command.autocomplete(param.name)(_topic_choices(choices))
        elif param.type is ParamType.VERSION:
            command.autocomplete(param.name)(_version_choices(choices))
    return command


def _topic_choices(choices: Choices) -> Any:
    async def complete(
        interaction: discord.Interaction, current: str
    ) -> list[app_commands.Choice[str]]:
        return [
            app_commands.Choice(name=t[:100], value=t[:100])
            for t in await choices(interaction, "topic", current)
        ]

    return complete


def _version_choices(choices: Choices) -> Any:
    async def complete(
        interaction: discord.Interaction, current: str
    ) -> list[app_commands.Choice[int]]:
        out: list[app_commands.Choice[int]] = []
        for label in await choices(interaction, "version", current):
            match = _LEADING_NUMBER.match(label)
            if match:
                out.append(app_commands.Choice(name=label[:100], value=int(match.group(1))))
        return out

    return complete
