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

from pydantic import BaseModel, ConfigDict, Field


class ParamType(StrEnum):
    """What a parameter holds; each platform turns it into its own kind of option."""

    NUMBER = "number"  # a whole number within [low, high]
    VERSION = "version"  # a personality version (autocompleted on Discord)
    TOPIC = "topic"  # a belief topic, possibly several words (autocompleted on Discord)
    WORD = "word"  # one word, e.g. a spending limit: `2.50`, `off`, `default`
    TEXT = "text"  # free text to the end of the line (a reason)
    MEMBER = "member"  # a member: Discord's user picker; a mention or a name elsewhere
    FLAG = "flag"  # the parameter's own name typed as a word (`history all`)


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

    @property
    def usage(self) -> str:
        if self.type is ParamType.FLAG:
            return f"[{self.name}]"
        if self.required:
            return self.shown or f"<{self.name}>"
        return f"[{self.shown or self.name}]"


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

    def missing(self, args: tuple[str, ...]) -> list[Param]:
        """Required parameters not given (each takes at least one word)."""
        given = [a for a in args if a.strip()]
        needed = [p for p in self.params if p.required]
        return needed[len(given) :] if len(given) < len(needed) else []


#: `help` at chat width: descriptions start here and wrap at the width.
HELP_INDENT = 28
HELP_WIDTH = 88

TIMELINE_MAX_DAYS = 365
USAGE_MAX_DAYS = 90
HISTORY_MAX_COUNT = 50

_TOPIC = Param(name="topic", type=ParamType.TOPIC, description="A belief topic")

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
            Param(
                name="count",
                type=ParamType.NUMBER,
                description=f"How many versions (1-{HISTORY_MAX_COUNT}, default 10)",
                low=1,
                high=HISTORY_MAX_COUNT,
            ),
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
        params=(
            Param(
                name="days",
                type=ParamType.NUMBER,
                description=f"How many days to list (1-{USAGE_MAX_DAYS}, default 7)",
                low=1,
                high=USAGE_MAX_DAYS,
            ),
        ),
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
        name="timeline",
        summary="a picture of how my opinions moved, and who moved them",
        description="A picture of how its opinions moved, and who moved them",
        params=(
            Param(
                name="topic",
                type=ParamType.TOPIC,
                description="One belief (default: the strongest few)",
            ),
            Param(
                name="days",
                type=ParamType.NUMBER,
                description=f"Only the last days (1-{TIMELINE_MAX_DAYS}, default: all)",
                low=1,
                high=TIMELINE_MAX_DAYS,
            ),
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
            given = " ".join(p.shown or f"<{p.name}>" for p in c.params)
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
