"""Setting names the bot does not know: a typo must not pass as a setting.

Why: pydantic-settings ignores names it has no field for, so the daily budget written
without its `_USD` suffix started a bot with no spending limit and said nothing.
Every name under the bot's prefixes, in the environment or in `.env`, must be one the
bot reads; one that is not is a warning line naming the closest known setting, or a
refusal when SONALITY_STRICT_SETTINGS=true. A name an earlier release read (`REMOVED`)
is a note saying so instead, never a refusal: the bot runs as it did without it.

Why the known names come from `Settings` itself: a setting added to the model is known
at once, with no second list to forget. The few names read outside the model (test
hooks) are in `READ_OUTSIDE_SETTINGS`, and tests/integration/test_setting_names.py
checks that every name the code or `.env.example` mentions is known.
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Iterable, Mapping
from pathlib import Path

from dotenv import dotenv_values
from pydantic import AliasChoices, AliasPath

from bot.settings import Settings

#: The prefixes the bot owns: any name under them is meant for the bot.
PREFIXES = ("SONALITY_", "DISCORD_", "SLACK_")
#: Read with `os.environ` outside the settings model: the forget-me crash hook
#: (bot/forget_me.py, tests only).
READ_OUTSIDE_SETTINGS = frozenset({"SONALITY_TEST_KILL_AT_FORGET_STEP"})
#: Settings earlier releases read, and why they are gone.
REMOVED = {
    "SONALITY_MEMORY_PROCESS": "the memory process was removed; Chroma runs in the bot's "
    "process, or on a Chroma server with CHROMA_URL",
}
#: How alike a known name must be to be offered as "did you mean" (difflib's ratio).
SIMILAR_ENOUGH = 0.6


def known_names() -> frozenset[str]:
    """Every variable the bot reads, upper case (pydantic-settings ignores case)."""
    names = set(READ_OUTSIDE_SETTINGS)
    for name, field in Settings.model_fields.items():
        names.add((field.alias or name).upper())
        names.update(str(alias).upper() for alias in _aliases(field.validation_alias))
    return frozenset(names)


def _aliases(alias: str | AliasPath | AliasChoices | None) -> list[str | int]:
    if alias is None:
        return []
    if isinstance(alias, str):
        return [alias]
    if isinstance(alias, AliasPath):
        return alias.path[:1]
    return [a for choice in alias.choices for a in _aliases(choice)]


def _named(environ: Mapping[str, str], dotenv: Mapping[str, str | None]) -> dict[str, str]:
    """Where each name under the bot's prefixes is set (`.env` first)."""
    found: dict[str, str] = {}
    for where, names in (("in .env", dotenv), ("in the environment", environ)):
        for name in names:
            if name.upper().startswith(PREFIXES):
                found.setdefault(name, where)
    return found


def unknown_names(
    environ: Mapping[str, str], dotenv: Mapping[str, str | None]
) -> list[tuple[str, str]]:
    """(name, where) of every name under the bot's prefixes that it does not read and
    never did."""
    known = known_names() | REMOVED.keys()
    return sorted((n, w) for n, w in _named(environ, dotenv).items() if n.upper() not in known)


def removed_names(
    environ: Mapping[str, str], dotenv: Mapping[str, str | None]
) -> list[tuple[str, str]]:
    """(name, where) of every setting that is set but was removed (`REMOVED`)."""
    return sorted((n, w) for n, w in _named(environ, dotenv).items() if n.upper() in REMOVED)


def describe_removed(name: str, where: str) -> str:
    """One line about one removed setting, without its value."""
    return f"{name} ({where}) is no longer a setting and is ignored: {REMOVED[name.upper()]}"


def closest(name: str, known: Iterable[str]) -> str | None:
    """The known name `name` was most likely meant to be, if any is alike enough."""
    matches = difflib.get_close_matches(name.upper(), list(known), n=1, cutoff=SIMILAR_ENOUGH)
    return matches[0] if matches else None


def describe(name: str, where: str, outcome: str) -> str:
    """One line about one unknown name, without its value (it may be a secret)."""
    guess = closest(name, known_names())
    hint = (
        f"did you mean {guess}?"
        if guess
        else "no setting has a similar name (.env.example has them all)"
    )
    return f"{name} ({where}) is not a setting of this bot, {outcome}; {hint}"


def read_dotenv(settings: type[Settings] = Settings) -> dict[str, str | None]:
    """The names in the `.env` file `Settings` reads (none if there is no such file)."""
    env_file = settings.model_config.get("env_file")
    if not isinstance(env_file, str | os.PathLike) or not Path(env_file).is_file():
        return {}
    return dotenv_values(env_file, encoding=settings.model_config.get("env_file_encoding"))
