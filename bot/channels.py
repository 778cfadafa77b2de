"""Where the bot may speak: each channel's mode, and the pace of a free channel.

Why the runtime decides and not the adapters: an adapter knows whether a message
addressed the bot (an @mention, a reply to it, a DM), but not what a community's
moderators chose for the channel. So the adapters hand over every member message they
can read, marked `addressed` or not, and `hearing` decides here, the same way on every
platform:

- `mention` (the default unless SONALITY_CHANNEL_MODE says otherwise): addressed
  messages only, as the bot always did;
- `free`: every member message, but an unprompted reply (to a message that did not
  address the bot) at most once per SONALITY_FREE_CHANNEL_SECONDS per channel, so a
  busy channel is not drowned; addressed messages are always answered;
- `off`: nothing, and no model call; `/sonality` commands still work there.

A DM has no channel modes: every message in it is addressed, and whether DMs are
answered at all is the operator's (DISCORD_ALLOW_DMS, SLACK_ALLOW_DMS).

Why a cache: with the platform sending every message of a channel, a database read per
message would cost more than the answers. One process (SQLite) is the only writer, so
its cache is always right; processes sharing a PostgreSQL database reread a community's
modes after `SHARED_FRESH_SECONDS`, so a mode set through another process applies
within that long. The pace is counted per process: on Discord each guild's messages
reach one process, on Slack over HTTP behind several processes each may give one
unprompted reply per window.
"""

from __future__ import annotations

import logging
import math
import time
from datetime import UTC, datetime
from enum import Enum

from bot.messages import CommandRequest, CommandResult, IncomingMessage, User, is_dm
from storage import Database
from storage.channels import ChannelMode, ChannelSetting

__all__ = ["ChannelMode", "ChannelModes", "Hearing", "run_channel_command"]

log = logging.getLogger(__name__)

#: How long a process sharing the database trusts the modes it read.
SHARED_FRESH_SECONDS = 10.0
#: Channels whose last unprompted reply is remembered before old entries are dropped.
MAX_PACED_CHANNELS = 10_000

MEANING = {
    ChannelMode.MENTION: "I answer when I'm mentioned or replied to",
    ChannelMode.FREE: "I answer every member's message",
    ChannelMode.OFF: "I answer nothing here; commands still work",
}


class Hearing(Enum):
    """What the runtime does with one member message."""

    ANSWER = "answer"  # addressed, in a channel where the bot speaks
    UNPROMPTED = "unprompted"  # not addressed, in a free channel
    SILENT = "silent"  # an `off` channel, or a mention channel's chatter


class ChannelModes:
    def __init__(
        self, db: Database, default: ChannelMode, free_seconds: float, *, shared: bool
    ) -> None:
        self._db = db
        self.default = default
        self.free_seconds = free_seconds
        self._fresh_for = SHARED_FRESH_SECONDS if shared else math.inf
        # community -> (when read, channel -> mode): the modes only, never who set
        # them, so a forget-me leaves no name behind here.
        self._cache: dict[str, tuple[float, dict[str, ChannelMode]]] = {}
        # (community, channel) -> monotonic time of the last unprompted reply
        self._last_unprompted: dict[tuple[str, str], float] = {}
        # Raised by every change this process makes: a read that started before one
        # may hold the old modes, and is not cached (on SQLite it would stay for good).
        self._changes = 0

    async def settings(self, community_id: str) -> dict[str, ChannelSetting]:
        """The community's channels a moderator set, by channel id, read from the
        database (for commands; messages use the cached modes)."""
        changes = self._changes
        found = {s.channel_id: s for s in await self._db.channel_settings(community_id)}
        if changes == self._changes:
            self._cache[community_id] = (
                time.monotonic(),
                {channel: s.mode for channel, s in found.items()},
            )
        return found

    async def mode(self, community_id: str, channel_id: str) -> ChannelMode:
        cached = self._cache.get(community_id)
        if cached is None or time.monotonic() - cached[0] >= self._fresh_for:
            here = (await self.settings(community_id)).get(channel_id)
            return self.default if here is None else here.mode
        return cached[1].get(channel_id, self.default)

    async def hearing(self, message: IncomingMessage) -> Hearing:
        if is_dm(message.community.id):
            return Hearing.ANSWER if message.addressed else Hearing.SILENT
        mode = await self.mode(message.community.id, message.channel_id)
        if mode is ChannelMode.OFF:
            return Hearing.SILENT
        if message.addressed:
            return Hearing.ANSWER
        return Hearing.UNPROMPTED if mode is ChannelMode.FREE else Hearing.SILENT

    def turn_due(self, community_id: str, channel_id: str) -> bool:
        """Whether an unprompted reply in this channel would be within the pace."""
        last = self._last_unprompted.get((community_id, channel_id))
        return last is None or time.monotonic() - last >= self.free_seconds

    def take_turn(self, community_id: str, channel_id: str) -> bool:
        """Claim the channel's unprompted reply of this window (False: already taken).
        Claimed before the model is asked, so two messages arriving together get one."""
        if not self.turn_due(community_id, channel_id):
            return False
        if len(self._last_unprompted) >= MAX_PACED_CHANNELS:
            cutoff = time.monotonic() - self.free_seconds
            self._last_unprompted = {k: v for k, v in self._last_unprompted.items() if v >= cutoff}
        self._last_unprompted[(community_id, channel_id)] = time.monotonic()
        return True

    async def set(
        self, community_id: str, channel_id: str, channel_name: str, mode: ChannelMode, by: User
    ) -> None:
        await self._db.set_channel_mode(
            community_id,
            channel_id,
            mode,
            channel_name=channel_name,
            set_by_id=by.id,
            set_by_name=by.name,
            at=datetime.now(UTC),
        )
        self._changes += 1
        self._cache.pop(community_id, None)  # read again, with the new row

    def forget(self, community_id: str) -> None:
        """Drop what is kept of an erased community."""
        self._changes += 1
        self._cache.pop(community_id, None)
        for key in [k for k in self._last_unprompted if k[0] == community_id]:
            del self._last_unprompted[key]

    def meaning(self, mode: ChannelMode) -> str:
        if mode is ChannelMode.FREE and self.free_seconds > 0:
            return (
                f"{MEANING[mode]} (mentions always, the others at most once every "
                f"{self.free_seconds:g} seconds)"
            )
        return MEANING[mode]

    async def status_line(self, community_id: str, *, names: bool) -> str:
        """One `status` line: the default and the channels set apart from it, by name
        for a moderator (`names`), else how many (see `run_channel_command`)."""
        apart = _apart(await self.settings(community_id), self.default)
        line = f"Channels: {self.default} unless set"
        if apart and names:
            line += " (" + "; ".join(f"{_name(s)}: {s.mode}" for s in apart) + ")"
        elif apart:
            line += f" ({len(apart)} set apart; moderators see which)"
        return line


def _apart(settings: dict[str, ChannelSetting], default: ChannelMode) -> list[ChannelSetting]:
    return sorted(
        (s for s in settings.values() if s.mode is not default),
        key=lambda s: (s.channel_name.lower(), s.channel_id),
    )


def _name(setting: ChannelSetting) -> str:
    if setting.channel_name:
        return f"#{setting.channel_name} ({setting.channel_id})"
    return f"channel {setting.channel_id}"


async def run_channel_command(modes: ChannelModes, request: CommandRequest) -> CommandResult:
    """`/sonality channel [mention|free|off]` in the channel concerned. The argument was
    checked against the table's choices (`Command.bad_choice`), and only a moderator
    gets this far with one."""
    cid, channel = request.community.id, request.channel_id
    if is_dm(cid):
        return CommandResult(
            text="Channel modes are for a community's channels; here I answer every message.",
            ok=False,
            private=True,
        )
    if channel is None:
        return CommandResult(
            text="Run `/sonality channel` in the channel it is about.", ok=False, private=True
        )
    word = request.args[0].strip().lower() if request.args else ""
    if word:
        mode = ChannelMode(word)
        if mode is ChannelMode.FREE and request.free_refusal:
            return CommandResult(text=request.free_refusal, ok=False, private=True)
        await modes.set(cid, channel, request.channel_name, mode, request.caller)
        log.info(
            "channel %s in %s set to %s by %s",
            channel,
            cid,
            mode,
            request.caller.id,
            extra={"community": cid},
        )
        return CommandResult(text=f"This channel is now `{mode}`: {modes.meaning(mode)}.")
    settings = await modes.settings(cid)
    here = settings.get(channel)
    current = modes.default if here is None else here.mode
    lines = [
        f"This channel: `{current}`{' (the default)' if here is None else ''}: "
        f"{modes.meaning(current)}."
    ]
    apart = _apart(settings, modes.default)
    if apart and not request.is_moderator:
        # A moderator may set a private channel apart: its name is not for everyone.
        lines.append(
            f"{len(apart)} channel(s) are set apart from the default (`{modes.default}`); "
            "moderators see which."
        )
    elif apart:
        lines.append(f"Channels set apart from the default (`{modes.default}`):")
        for setting in apart:
            who = setting.set_by_name or setting.set_by_id
            lines.append(
                f"• {_name(setting)}: `{setting.mode}`, set by {who} on {setting.set_at:%Y-%m-%d}"
            )
    else:
        lines.append(f"Every other channel follows the default (`{modes.default}`).")
    return CommandResult(text="\n".join(lines), title="Channel")
