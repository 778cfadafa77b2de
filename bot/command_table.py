"""The `/sonality` commands, defined once.

Every place that shows or accepts a command reads this table: the handlers' moderator
rule and argument check (`bot.commands`), `help`, Discord's registered command group,
the terminal's and Slack's parsers, the Slack manifest's usage hint and the command
tables of the README and docs/using.md (both checked against it by tests/docs). Before
it, four hand-written lists drifted apart: Discord registered `history` without its
options and `rollback` without a reason, and the manifest missed four commands.
"""

from __future__ import annotations

import shlex
import textwrap
from enum import StrEnum
from typing import Self

from pydantic import BaseModel, ConfigDict, Field, model_validator


class ParamType(StrEnum):
    """What a parameter holds; each platform turns it into its own kind of option."""

    NUMBER = "number"  # a whole number within [low, high]
    VERSION = "version"  # a personality version (autocompleted on Discord)
    TOPIC = "topic"  # a belief topic, possibly several words (autocompleted on Discord)
    WORD = "word"  # one word, e.g. a spending limit: `2.50`, `off`, `default`
    TEXT = "text"  # free text to the end of the line (a reason)
    MEMBER = "member"  # a member: Discord's user picker; a mention or a name elsewhere
    FLAG = "flag"  # the parameter's own name typed as a word (`history all`)
    CHOICE = "choice"  # one of `choices`: Discord's choice list; typed elsewhere


class Access(StrEnum):
    EVERYONE = "everyone"
    MODERATORS = "moderators"
    #: Anyone may look (no arguments); changing something needs a moderator.
    MODERATORS_TO_CHANGE = "moderators to change"


class Param(BaseModel):
    model_config = ConfigDict(frozen=True)

    name: str = Field(pattern=r"^[a-z][a-z_]*$")
    type: ParamType
    description: str = Field(max_length=100)  # Discord's limit for option descriptions
    required: bool = False
    low: int | None = None
    high: int | None = None
    #: How `help` writes the value when `<name>` says too little (`<usd>|off|default`).
    shown: str = ""
    #: Only typed on text platforms: Discord asks with buttons instead (forget-me).
    text_only: bool = False
    #: The words a CHOICE parameter takes (lower case).
    choices: tuple[str, ...] = ()

    @model_validator(mode="after")
    def _choices_for_choice(self) -> Self:
        if (self.type is ParamType.CHOICE) != bool(self.choices):
            raise ValueError("a CHOICE parameter, and only one, lists its choices")
        return self

    @property
    def given(self) -> str:
        """The value as `help` writes it when it must be given: `<usd>|off|default`,
        `mention|free|off`, `<version>`."""
        return self.shown or "|".join(self.choices) or f"<{self.name}>"

    @property
    def usage(self) -> str:
        if self.type is ParamType.FLAG:
            return f"[{self.name}]"
        if self.required:
            return self.given
        return f"[{self.shown or '|'.join(self.choices) or self.name}]"


class Command(BaseModel):
    model_config = ConfigDict(frozen=True)

    name: str = Field(pattern=r"^[a-z][a-z-]*$", max_length=32)
    summary: str  # the help line, in the bot's voice
    description: str = Field(max_length=100)  # Discord's limit for command descriptions
    params: tuple[Param, ...] = ()
    access: Access = Access.EVERYONE
    #: The answer is about the caller alone, so only they see it.
    private: bool = False
    #: The handler writes the moderator log itself (it must leave out the member a
    #: `forget-user` names, and keep the reason it parses).
    audits_itself: bool = False
    #: Once confirmed, it forgets a member: an adapter drops what it saved of members.
    forgets: bool = False

    def needs_moderator(self, args: tuple[str, ...] = ()) -> bool:
        if self.access is Access.MODERATORS_TO_CHANGE:
            return any(a.strip() for a in args)
        return self.access is Access.MODERATORS

    def usage(self, *, text: bool = True) -> str:
        shown = [p.usage for p in self.params if text or not p.text_only]
        return " ".join([self.name, *shown])

    @property
    def discord_description(self) -> str:
        """Discord cannot hide a subcommand of a group from members, so a moderators'
        command says so where the picker shows it."""
        if self.access is Access.MODERATORS:
            return f"Moderators: {self.description}"[:100]
        return self.description

    def text_args(self, words: list[str]) -> tuple[str, ...]:
        """The words typed after the command name, as the handler takes them: a lone
        topic keeps its spaces (`beliefs nuclear energy`)."""
        if words and len(self.params) == 1 and self.params[0].type is ParamType.TOPIC:
            return (" ".join(words),)
        return tuple(words)

    def bad_choice(self, args: tuple[str, ...]) -> str:
        """What is wrong with a word given for a CHOICE parameter ("" : nothing), in
        the words the caller sees; Discord offers only the choices, text platforms
        let anything be typed."""
        for param, value in zip(self.params, args, strict=False):
            word = value.strip().lower()
            if param.type is ParamType.CHOICE and word and word not in param.choices:
                listed = ", ".join(f"`{c}`" for c in param.choices)
                shown = word if len(word) <= 24 else word[:23] + "…"
                return f"`{shown}` is not a {param.name}: use {listed}."
        return ""

    def missing(self, args: tuple[str, ...]) -> list[Param]:
        """Required parameters not given (each takes at least one word)."""
        given = [a for a in args if a.strip()]
        needed = [p for p in self.params if p.required]
        return needed[len(given) :] if len(given) < len(needed) else []


#: `help` at chat width: descriptions start here and wrap at the width, which also
#: fits an 80-column terminal.
HELP_INDENT = 28
HELP_WIDTH = 79

TIMELINE_MAX_DAYS = 365
USAGE_MAX_DAYS = 90
HISTORY_MAX_COUNT = 50

_TOPIC = Param(name="topic", type=ParamType.TOPIC, description="A belief topic")


def _up_to(name: str, high: int, what: str, default: str) -> Param:
    """A whole number from 1 to `high`, its description showing the range (so Discord's
    bounds and the words beside them cannot disagree) and `default`."""
    return Param(
        name=name,
        type=ParamType.NUMBER,
        description=f"{what} (1-{high}, {default})",
        low=1,
        high=high,
    )


COMMANDS: tuple[Command, ...] = (
    Command(
        name="beliefs",
        summary="what I currently think, how sure I am and why",
        description="What it believes now, optionally on one topic",
        params=(_TOPIC,),
    ),
    Command(
        name="history",
        summary="versions where my views or self-description changed (all: every version, "
        "chat included)",
        description="Recent personality versions",
        params=(
            Param(name="all", type=ParamType.FLAG, description="Every version, chat included"),
            _up_to("count", HISTORY_MAX_COUNT, "How many versions", "default 10"),
        ),
    ),
    Command(
        name="diff",
        summary="compare two versions",
        description="What changed between two versions",
        params=(
            Param(name="a", type=ParamType.VERSION, description="The older version", required=True),
            Param(name="b", type=ParamType.VERSION, description="The newer version", required=True),
        ),
    ),
    Command(
        name="snapshot",
        summary="my self-description (current or at a version)",
        description="The personality's self-description, now or at a version",
        params=(
            Param(name="version", type=ParamType.VERSION, description="A version (default: now)"),
        ),
    ),
    Command(
        name="status",
        summary="interactions, beliefs, updates in waiting, next reflection",
        description="How the personality is doing",
    ),
    Command(
        name="usage",
        summary="tokens and estimated cost: today, each day, this month",
        description="Tokens and estimated cost, by day and role",
        params=(_up_to("days", USAGE_MAX_DAYS, "How many days to list", "default 7"),),
    ),
    Command(
        name="budget",
        summary="today's spending and the daily limit; moderators: set this community's "
        "daily limit",
        description="Today's spending and the daily limit",
        params=(
            Param(
                name="amount",
                type=ParamType.WORD,
                description='Moderators: a daily limit in USD, "off" for none, or "default"',
                shown="<usd>|off|default",
            ),
        ),
        access=Access.MODERATORS_TO_CHANGE,
    ),
    Command(
        name="channel",
        summary="where I speak in this channel, and the channels set apart from the "
        "default; moderators: mention (only when mentioned), free (every message) or off",
        description="Where it speaks in this channel",
        params=(
            Param(
                name="mode",
                type=ParamType.CHOICE,
                description="Moderators: mention (when mentioned), free (every message) or off",
                choices=("mention", "free", "off"),
            ),
        ),
        access=Access.MODERATORS_TO_CHANGE,
    ),
    Command(
        name="timeline",
        summary="a picture of how my opinions moved, and who moved them",
        description="A picture of how its opinions moved, and who moved them",
        params=(
            Param(
                name="topic",
                type=ParamType.TOPIC,
                description="One belief (default: the strongest few)",
            ),
            _up_to("days", TIMELINE_MAX_DAYS, "Only the last days", "default: all"),
        ),
    ),
    Command(
        name="rollback",
        summary="restore a version (undoable)",
        description="Restore an earlier personality version",
        params=(
            Param(
                name="version",
                type=ParamType.VERSION,
                description="The version to restore",
                required=True,
            ),
            Param(name="reason", type=ParamType.TEXT, description="Why (kept in the history)"),
        ),
        access=Access.MODERATORS,
    ),
    Command(
        name="reflect",
        summary="consolidate what I've learned now",
        description="Reflect now instead of tonight",
        access=Access.MODERATORS,
    ),
    Command(
        name="my-data",
        summary="everything I keep about you, as a private JSON file",
        description="Everything kept about you, as a private file",
        private=True,
    ),
    Command(
        name="forget-me",
        summary="forget you: your messages, and their influence on my views",
        description="Forget me here: my messages and their influence",
        params=(
            Param(
                name="confirm",
                type=ParamType.FLAG,
                description="Go ahead (Discord asks with buttons)",
                text_only=True,
            ),
        ),
        private=True,
        forgets=True,
    ),
    Command(
        name="forget-user",
        summary="the same, for a member who asked",
        description="Forget a member who asked",
        params=(
            Param(
                name="member",
                type=ParamType.MEMBER,
                description="The member to forget",
                required=True,
            ),
            Param(
                name="reason",
                type=ParamType.TEXT,
                description="Why (kept in the log)",
                required=True,
            ),
        ),
        access=Access.MODERATORS,
        private=True,
        audits_itself=True,
        forgets=True,
    ),
    Command(name="help", summary="this list", description="What the /sonality commands do"),
)

BY_NAME: dict[str, Command] = {c.name: c for c in COMMANDS}
COMMAND_NAMES: tuple[str, ...] = tuple(BY_NAME)
PRIVATE_COMMANDS: frozenset[str] = frozenset(c.name for c in COMMANDS if c.private)


def command(name: str) -> Command | None:
    return BY_NAME.get(name.strip().lower())


def needs_moderator(name: str, args: tuple[str, ...]) -> bool:
    """Whether this command, with these arguments, changes something only moderators may."""
    found = command(name)
    return found is not None and found.needs_moderator(args)


def help_entries() -> list[tuple[str, str]]:
    """(usage, what it does) per line of `help`; a command anyone may look at but only
    moderators may change has a line for each."""
    entries = []
    for c in COMMANDS:
        if c.access is Access.MODERATORS_TO_CHANGE:
            look, change = c.summary.split("; moderators: ")
            given = " ".join(p.given for p in c.params)
            entries.append((c.name, look))
            entries.append((f"{c.name} {given}", f"moderators: {change}"))
        elif c.access is Access.MODERATORS:
            entries.append((c.usage(), f"moderators: {c.summary}"))
        else:
            entries.append((c.usage(), c.summary))
    return entries


def help_text() -> str:
    """`/sonality help`: one command a line, the description beside it when it fits."""
    lines = []
    for usage, what in help_entries():
        head = f"/sonality {usage}"
        first = f"{head:<{HELP_INDENT}}" if len(head) < HELP_INDENT else f"{head}   "
        wrapped = textwrap.wrap(
            what, HELP_WIDTH, initial_indent=first, subsequent_indent=" " * HELP_INDENT
        )
        lines.extend(wrapped)
    return "\n".join(lines)


def slack_usage_hint() -> str:
    """The manifest's `usage_hint` (Slack shows it under the command as it is typed)."""
    return " | ".join(c.usage() for c in COMMANDS)


def split_command(text: str, *, quotes: bool = False) -> tuple[str, tuple[str, ...]]:
    """A typed `/sonality …` line (the part after `/sonality`) as a name and its
    arguments, the same way on every text platform. With `quotes` (the terminal),
    quotes group words and an unclosed one falls back to plain words; Slack keeps
    apostrophes as typed. No name means `help`."""
    words = text.split()
    if quotes:
        try:
            words = shlex.split(text)
        except ValueError:
            pass
    if not words:
        return "help", ()
    name = words[0].lower()
    found = command(name)
    return name, (found.text_args(words[1:]) if found else tuple(words[1:]))
