"""Discord faults that must cost one event or one command, never the connection.

Two of them come from Discord itself rather than from us:

- A gateway frame discord.py cannot decode (see `TolerantWebSocket`).
- A slash command this version of the bot does not have, or has in another shape: a
  registration Discord has not yet replaced everywhere after an update (clients cache
  the old one) offers a subcommand that is gone, or an old signature without an option
  that is now required. discord.py reports these to the tree's error handler, and an
  interaction nobody answers shows the member "The application did not respond".
"""

from __future__ import annotations

import json
import logging
import re
from typing import Any

import discord
import discord.client
import discord.shard
from discord import app_commands
from discord.gateway import DiscordWebSocket

from adapters.sanitize import clean_name
from bot.messages import INTERNAL_ERROR

log = logging.getLogger("adapters.discord")

_EVENT_NAME = re.compile(r'"t"\s*:\s*"([A-Z_]{1,64})"')
_SEQUENCE = re.compile(r'"s"\s*:\s*(\d{1,19})\b')
#: The modules whose `DiscordWebSocket` global discord.py's clients connect with.
_CONNECTING_MODULES = (discord.client, discord.shard)
_CLASS_NAME = "DiscordWebSocket"

NO_MENTIONS = discord.AllowedMentions.none()


class TolerantWebSocket(DiscordWebSocket):
    """discord.py's gateway connection, except that a frame it cannot decode is skipped.

    Why: discord.py decodes frames with orjson when it is installed, and orjson refuses
    JSON that escapes a lone surrogate (`"content": "\\ud800"`), which the standard
    library accepts. That `JSONDecodeError` is not a network error, so it escapes
    `Client.connect`'s reconnect loop and ends the client: one odd message would take the
    bot off Discord. Skipping the frame costs that one event and keeps the session.

    Why here and like this: the decode is the first thing `received_message` does with
    a whole frame, before any state changes, and a frame must be decompressed exactly
    once; so this decompresses, hands the parent the text (which it then does not
    decompress again) and catches only a decoding error.

    An event discord.py decodes but cannot read (a field missing, a null where an object
    belongs) raises in its parser, which runs inline here (only the handlers it
    dispatches are tasks): a `KeyError` or `TypeError` that would end the client just
    the same, and with it the process. Such a dispatch is skipped too, after discord.py
    has taken its sequence number; READY and RESUMED are not (a session that did not
    start must not look started), nor anything that is not a dispatch.
    """

    async def received_message(self, msg: Any, /) -> None:
        if type(msg) is bytes:
            msg = self._decompressor.decompress(msg)
            if msg is None:  # part of a frame
                return
        try:
            await super().received_message(msg)
        except json.JSONDecodeError as exc:  # orjson's error is a subclass
            event = _EVENT_NAME.search(msg)
            sequence = _SEQUENCE.search(msg)
            if sequence is not None:
                # Acknowledged as seen, so a resumed session does not send it again.
                self.sequence = int(sequence.group(1))
            log.warning(
                "Discord: skipped a gateway event that could not be decoded "
                "(%s, seq %s, shard %s): %s",
                event.group(1) if event else "unknown event",
                sequence.group(1) if sequence else "?",
                self.shard_id,
                exc,
            )
        except (KeyError, TypeError, AttributeError, ValueError) as exc:
            skipped = _unreadable_dispatch(msg)
            if skipped is None:
                raise
            log.warning(
                "Discord: skipped a gateway event discord.py could not read (%s, seq %s, "
                "shard %s): %s: %s",
                skipped,
                self.sequence,
                self.shard_id,
                type(exc).__name__,
                exc,
            )


def _unreadable_dispatch(frame: str) -> str | None:
    """The event name of `frame` if it is a dispatch a parser may skip, else None."""
    try:
        decoded = json.loads(frame)
    except ValueError:
        return None
    if not isinstance(decoded, dict) or decoded.get("op") != DiscordWebSocket.DISPATCH:
        return None
    event = decoded.get("t")
    if not isinstance(event, str) or event in ("READY", "RESUMED"):
        return None
    return event


class GatewayClass:
    """Makes discord.py's clients connect with `TolerantWebSocket`, and undoes it.

    discord.py names the class to connect with as a module global of `discord.client`
    and `discord.shard`, i.e. process-wide state, so it is put back on close, as the
    adapter does with the endpoints.
    """

    def __init__(self) -> None:
        self._saved: list[tuple[Any, type[DiscordWebSocket]]] | None = None

    def apply(self) -> None:
        if self._saved is None:
            self._saved = [(m, getattr(m, _CLASS_NAME)) for m in _CONNECTING_MODULES]
        for module in _CONNECTING_MODULES:
            setattr(module, _CLASS_NAME, TolerantWebSocket)

    def restore(self) -> None:
        if self._saved is not None:
            for module, cls in self._saved:
                setattr(module, _CLASS_NAME, cls)
            self._saved = None


def command_error_text(error: app_commands.AppCommandError) -> str:
    """The member's answer to a slash command that could not run, in words."""
    if isinstance(error, app_commands.CommandNotFound):
        called = clean_name(" ".join([*error.parents, error.name]))
        return (
            f"I don't have `/{called}`: Discord may still be showing an older list of my "
            "commands (it catches up by itself; restarting Discord helps). "
            "`/sonality help` lists what I can do."
        )
    if isinstance(error, app_commands.CommandSignatureMismatch):
        return (
            f"`/{error.command.qualified_name}` arrived in an older shape than I know (an "
            "option missing or renamed): Discord may still be showing an older list of my "
            "commands. Try it again in a little while; `/sonality help` lists them."
        )
    if isinstance(error, app_commands.TransformerError):
        return f"`{clean_name(str(error.value))}` is not a value this option takes."
    return INTERNAL_ERROR


async def answer_command_error(
    interaction: discord.Interaction, error: app_commands.AppCommandError
) -> None:
    """Log why, and answer the member privately: nothing else may see it, and
    silence would read as the bot being down."""
    where = (interaction.guild_id, interaction.channel_id)
    if isinstance(error, app_commands.CommandInvokeError):
        log.error(
            "Discord: a slash command failed (guild %s, channel %s)",
            *where,
            exc_info=(type(error.original), error.original, error.original.__traceback__),
        )
    else:
        log.warning(
            "Discord: slash command not run (guild %s, channel %s): %s: %s",
            *where,
            type(error).__name__,
            clean_name(str(error), 300),
        )
    response = interaction.response
    try:
        if interaction.type is discord.InteractionType.autocomplete:
            if not response.is_done():  # suggestions are the only possible answer
                await response.autocomplete([])
            return
        text = command_error_text(error)
        if response.is_done():
            await interaction.followup.send(text, ephemeral=True, allowed_mentions=NO_MENTIONS)
        else:
            await response.send_message(text, ephemeral=True, allowed_mentions=NO_MENTIONS)
    except discord.HTTPException as exc:
        log.warning(
            "Discord: could not answer a failed slash command (guild %s, channel %s): "
            "HTTP %s code %s",
            *where,
            exc.status,
            exc.code,
        )
    except Exception:  # the error handler must not become the next unhandled error
        log.exception("Discord: answering a failed slash command failed")
