"""Discord adapter: one guild = one community = one evolving personality.

Everything Discord-specific stops here: the runtime sees only `IncomingMessage` /
`CommandRequest` and answers with `Reply` / `CommandResult`. This module decides
whether a message addressed the bot (an @mention or a reply to one of its messages);
whether the bot answers is the runtime's, from the channel's mode (`bot.channels`):
in a `free` channel it answers messages that did not address it too, which Discord
sends with their text only under the Message Content intent. It turns Discord markup
into plain text the model can read, and renders answers back within Discord's limits
(2,000 characters, interaction deadlines, no pings).

Discord faults (403 missing access, 400 invalid form body, 429s that outlast
discord.py's own retries) are logged with guild and channel ids and swallowed: one
bad channel permission must never take the bot down, and the runtime's background
post-processing is independent of whether the reply could be delivered.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import logging
import re
from collections.abc import Mapping, Sequence
from typing import Any, Literal

import aiohttp
import discord
import yarl
from discord import app_commands
from discord.gateway import DiscordWebSocket
from discord.http import Route
from discord.utils import MISSING

from adapters.chunking import split_message
from adapters.discord_commands import build_group
from adapters.discord_confirm import ConfirmView
from adapters.discord_faults import GatewayClass, answer_command_error
from adapters.discord_files import fit_attachments
from adapters.sanitize import MAX_COMMUNITY_NAME_CHARS, clean_command, clean_name, clean_text
from bot.command_table import PRIVATE_COMMANDS, needs_moderator
from bot.images import AttachedFile, ImageFetcher
from bot.interface import ChatRuntime, Started, StartupError
from bot.messages import (
    INTERNAL_ERROR,
    CommandRequest,
    CommandResult,
    Community,
    IncomingMessage,
    Reply,
    ReplyKind,
    User,
    dm_community_id,
)
from bot.settings import Settings
from providers import connection_failure

__all__ = ["FREE_NEEDS_INTENT", "INTENTS_HELP", "MESSAGE_LIMIT", "TOKEN_HELP", "DiscordAdapter"]

log = logging.getLogger(__name__)

PLATFORM = "discord"
MESSAGE_LIMIT = 2000
# Past this, a command's output is a wall of followups nobody scrolls; a file is kinder.
ATTACH_THRESHOLD = 4 * MESSAGE_LIMIT
AUTOCOMPLETE_TIMEOUT = 2.5  # Discord drops autocomplete answers after 3 s
#: Where Discord serves attachments (`url` on the CDN, `proxy_url` on the media proxy).
CDN_HOSTS = ("https://cdn.discordapp.com", "https://media.discordapp.net")
NO_MENTIONS = discord.AllowedMentions.none()

INTENTS_HELP = (
    "Discord refused the connection (close code 4014, disallowed intents): "
    'DISCORD_MESSAGE_CONTENT_INTENT=true needs "Message Content Intent" enabled under '
    "Bot → Privileged Gateway Intents in the Discord Developer Portal; enable it, or "
    "unset DISCORD_MESSAGE_CONTENT_INTENT (the bot then answers @mentions and DMs)."
)
#: `/sonality channel free` without the intent: Discord would send the bot no text of
#: the messages a free channel is for.
FREE_NEEDS_INTENT = (
    "A free channel needs the Message Content intent, which this bot runs without: the "
    "operator sets DISCORD_MESSAGE_CONTENT_INTENT=true and enables Message Content Intent "
    "in the Discord Developer Portal. Nothing was changed."
)
TOKEN_HELP = (
    "Discord rejected DISCORD_TOKEN: copy a fresh token from Bot → Reset Token in the "
    "Discord Developer Portal."
)
_CLOSE_CODE_HELP = {
    4004: TOKEN_HELP,
    4010: "Discord rejected the shard setup (close code 4010): check DISCORD_SHARD_COUNT.",
    4011: "Discord requires sharding for this bot (close code 4011): set DISCORD_SHARD_COUNT.",
    4013: "Discord rejected the gateway intents (close code 4013, invalid intents).",
    4014: INTENTS_HELP,
}
_USER_MENTION = re.compile(r"<@!?(\d+)>")
_ROLE_MENTION = re.compile(r"<@&(\d+)>")
_CHANNEL_MENTION = re.compile(r"<#(\d+)>")


#: Discord allows 5 edits per 5 s in a channel: one edit a second stays under it.
EDIT_EVERY = 1.0
#: Without a finished sentence, the first words show after this long.
FIRST_AFTER = 1.0
_SENTENCE_END = re.compile(r"[.!?…](\s|$)")


class StreamedReply:
    """A reply shown while the model writes it: a first message, then edits in place.

    Why a task of its own: the model's stream must never wait for Discord, so `feed`
    only appends; the task shows the text once a sentence (or `FIRST_AFTER` of text)
    is there, then edits at most once per `EDIT_EVERY` (Discord's per-channel edit
    limit; discord.py still waits out any 429 itself). What is shown is always
    `split_message` of the text so far: the 2,000-character split, with an open code
    fence closed in the shown text and reopened in the next message, and a fence line
    still being typed held back, so no half-open fence is ever on screen.
    """

    def __init__(
        self,
        trigger: discord.Message,
        *,
        first_after: float | None = None,
        edit_every: float | None = None,
    ) -> None:
        self.trigger = trigger
        self.first_after = FIRST_AFTER if first_after is None else first_after
        self.edit_every = EDIT_EVERY if edit_every is None else edit_every
        self.text = ""
        self.sent: list[discord.Message] = []
        self.shown: list[str] = []
        self.failed = False
        self._first_at: float | None = None
        self._wake = asyncio.Event()
        # Held while a request is out: `stop` never cancels one half-way (a message
        # Discord stored but we never heard back about would be sent twice).
        self._busy = asyncio.Lock()
        self._task: asyncio.Task[None] | None = None

    async def feed(self, piece: str) -> None:
        self.text += piece
        if self._task is None:
            self._first_at = asyncio.get_running_loop().time()
            self._task = asyncio.create_task(self._run(), name="discord stream")
        self._wake.set()

    async def finish(self, reply: Reply) -> None:
        """Show the final text: the whole answer, or what was shown plus the note."""
        await self.stop()
        if reply.kind is ReplyKind.ANSWER:
            final = reply.text
        else:
            final = self.text.rstrip() + "\n\n" + reply.text
        await self._show(final)

    async def stop(self) -> None:
        if self._task is not None:
            async with self._busy:
                self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        assert self._first_at is not None
        while not _SENTENCE_END.search(self.text):
            left = self._first_at + self.first_after - loop.time()
            if left <= 0:
                break
            self._wake.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), left)
        while not self.failed:
            self._wake.clear()
            async with self._busy:
                await self._show(_visible(self.text))
            await asyncio.sleep(self.edit_every)
            await self._wake.wait()

    async def _show(self, text: str) -> None:
        """Make Discord show `text`: edit the messages that changed, send new ones."""
        if self.failed:
            return
        channel = self.trigger.channel
        guild_id = self.trigger.guild.id if self.trigger.guild else None
        for index, chunk in enumerate(split_message(text, MESSAGE_LIMIT)):
            try:
                if index < len(self.sent):
                    if self.shown[index] != chunk:
                        await self.sent[index].edit(content=chunk, allowed_mentions=NO_MENTIONS)
                        self.shown[index] = chunk
                    continue
                sent = await channel.send(
                    chunk,
                    reference=self.trigger.to_reference(fail_if_not_exists=False),
                    allowed_mentions=NO_MENTIONS,
                    mention_author=False,
                )
            except discord.HTTPException as exc:
                _log_discord_error("streamed reply", exc, guild_id, channel.id)
                self.failed = True
                return
            self.sent.append(sent)
            self.shown.append(chunk)


def _visible(text: str) -> str:
    """The text so far without a last line that may be a fence still being typed."""
    head, _, last = text.rpartition("\n")
    if last.lstrip().startswith("`") and "`" * 3 not in last[3:]:
        return head
    return text


class _Endpoints:
    """Points discord.py at another Discord (a fake in tests) and puts Discord back.

    discord.py keeps its endpoints in class attributes (`Route.BASE`,
    `DiscordWebSocket.DEFAULT_GATEWAY`), i.e. process-wide state; restoring them on
    close keeps one test's fake server from leaking into the next and keeps the real
    defaults Discord's.
    """

    def __init__(self) -> None:
        self._saved: tuple[str, yarl.URL] | None = None
        self._gateway_class = GatewayClass()  # a bad frame costs one event, not the bot

    def apply(self, api_base_url: str, gateway_url: str) -> None:
        if self._saved is None:
            self._saved = (Route.BASE, DiscordWebSocket.DEFAULT_GATEWAY)
        Route.BASE = api_base_url.rstrip("/")
        DiscordWebSocket.DEFAULT_GATEWAY = yarl.URL(gateway_url)
        self._gateway_class.apply()

    def restore(self) -> None:
        if self._saved is not None:
            Route.BASE, DiscordWebSocket.DEFAULT_GATEWAY = self._saved
            self._saved = None
        self._gateway_class.restore()


def _community(guild_id: int | None, guild_name: str, user: discord.abc.User) -> Community:
    """The guild's personality, or (in a DM) a private one per user: one place for both."""
    if guild_id is None:
        return Community(
            id=dm_community_id(PLATFORM, str(user.id)), name=f"DM with {clean_name(user.name)}"
        )
    return Community(
        id=f"{PLATFORM}:{guild_id}", name=clean_name(guild_name, MAX_COMMUNITY_NAME_CHARS)
    )


class _Hooks:
    """discord.py calls hooks as methods on the client; these forward to the adapter."""

    def __init__(self, adapter: DiscordAdapter, identify_delay: float, **options: Any) -> None:
        super().__init__(**options)
        self._adapter = adapter
        self._identify_delay = identify_delay

    async def setup_hook(self) -> None:
        await self._adapter._setup_hook()

    async def before_identify_hook(self, shard_id: int | None, *, initial: bool = False) -> None:
        # Discord allows one IDENTIFY per 5 s per bucket; tests shorten the wait.
        if not initial and self._identify_delay > 0:
            await asyncio.sleep(self._identify_delay)

    async def on_ready(self) -> None:
        self._adapter._ready.set()
        await self._adapter._removed_while_offline()

    async def on_message(self, message: discord.Message) -> None:
        await self._adapter._on_message(message)

    # MESSAGE_DELETE, MESSAGE_DELETE_BULK (a moderator's purge) and MESSAGE_UPDATE: the
    # raw events, sent whether or not discord.py's message cache holds the message.
    async def on_raw_message_delete(self, payload: discord.RawMessageDeleteEvent) -> None:
        await self._adapter._on_deleted(
            payload.guild_id, [payload.message_id], payload.cached_message
        )

    async def on_raw_bulk_message_delete(self, payload: discord.RawBulkMessageDeleteEvent) -> None:
        await self._adapter._on_deleted(payload.guild_id, sorted(payload.message_ids), None)

    async def on_raw_message_edit(self, payload: discord.RawMessageUpdateEvent) -> None:
        await self._adapter._on_edited(payload.message, payload.cached_message)

    # GUILD_DELETE without `unavailable` (kicked, banned, the guild deleted, or left);
    # an outage (`unavailable: true`) is on_guild_unavailable and changes nothing.
    async def on_guild_remove(self, guild: discord.Guild) -> None:
        await self._adapter._on_guild_membership(guild, removed=True)

    # GUILD_CREATE: a new invite (join), or a guild present on connect (available),
    # which is also how a re-invite made while the bot was offline shows up.
    async def on_guild_join(self, guild: discord.Guild) -> None:
        await self._adapter._on_guild_membership(guild, removed=False)

    async def on_guild_available(self, guild: discord.Guild) -> None:
        await self._adapter._on_guild_membership(guild, removed=False)


class _Client(_Hooks, discord.Client):
    pass


class _ShardedClient(_Hooks, discord.AutoShardedClient):
    pass


#: The answer to a slash command in a DM while the operator keeps DMs off.
DMS_OFF = "I don't take commands in direct messages here: use `/sonality` in a server."


class DiscordAdapter:
    """The `Adapter` for Discord: `await start()` serves until `await close()`.

    `client_options` go straight to the discord.py client (tests pass a tiny
    `guild_ready_timeout`); `identify_delay` is the pause between shard IDENTIFYs.
    """

    name = PLATFORM
    #: Seconds a Confirm / Cancel question waits for its member (well inside the
    #: interaction token's 15 minutes, which the expiry notice needs).
    confirm_timeout: float = 300.0

    def __init__(
        self,
        runtime: ChatRuntime,
        settings: Settings,
        *,
        client_options: Mapping[str, Any] | None = None,
        identify_delay: float = 5.0,
    ) -> None:
        self._runtime = runtime
        self._settings = settings
        self._answer_bots = settings.answer_bot_ids
        self._client_options = dict(client_options or {})
        self._identify_delay = identify_delay
        self._endpoints = _Endpoints()
        self._client: discord.Client | None = None
        self._tree: app_commands.CommandTree[Any] | None = None
        self._ready = asyncio.Event()
        # Attachments come from Discord's CDN; with DISCORD_API_BASE_URL set (a fake
        # Discord in the tests) also from that host, where the fake serves them.
        hosts = [*CDN_HOSTS]
        if "discord_api_base_url" in settings.model_fields_set:
            hosts.append(settings.discord_api_base_url)
        self._images = ImageFetcher(hosts, enabled=settings.reads_images, platform="Discord")

    # ------------------------------------------------------------------ lifecycle
    @property
    def client(self) -> discord.Client | None:
        return self._client

    async def wait_until_ready(self) -> None:
        """Until the gateway said READY and the guilds arrived (tests and health checks)."""
        await self._ready.wait()

    def intents(self) -> discord.Intents:
        """Only what answering needs: no member list, no presences (privacy, and each
        privileged intent needs its own approval). Message Content is opt-in: Discord
        sends the text of messages that @mention the app, and of DMs, without it."""
        intents = discord.Intents.none()
        intents.guilds = True
        intents.guild_messages = True
        intents.message_content = self._settings.discord_message_content
        if self._settings.discord_allow_dms:
            intents.dm_messages = True
        return intents

    def _log_triggers(self) -> None:
        if self._settings.discord_message_content:
            log.info(
                "Discord: answering @mentions and replies to its messages, and every "
                "member's message in free channels (Message Content on)"
            )
        else:
            log.info(
                "Discord: answering @mentions%s without the Message Content intent; a reply "
                "to the bot that does not ping it arrives without text and is skipped",
                " and DMs" if self._settings.discord_allow_dms else "",
            )
            if self._settings.channel_mode == "free":
                log.warning(
                    "Discord: SONALITY_CHANNEL_MODE=free, but without "
                    "DISCORD_MESSAGE_CONTENT_INTENT=true Discord sends no text of messages "
                    "that do not mention the bot: its channels answer mentions only"
                )

    def _build_client(self) -> discord.Client:
        # The bot never joins a voice channel: without this, every start logs two
        # warnings that PyNaCl and davey (voice libraries) are missing.
        discord.VoiceClient.warn_nacl = discord.VoiceClient.warn_dave = False
        options: dict[str, Any] = {
            "intents": self.intents(),
            "allowed_mentions": NO_MENTIONS,
            "chunk_guilds_at_startup": False,
        }
        options.update(self._client_options)
        client: discord.Client
        if self._settings.discord_shard_count is not None:
            options.setdefault("shard_count", self._settings.discord_shard_count)
            # Only these shards, so each guild's events reach one process of several.
            if self._settings.discord_shards is not None:
                options.setdefault("shard_ids", self._settings.discord_shards)
            client = _ShardedClient(self, self._identify_delay, **options)
        else:
            client = _Client(self, self._identify_delay, **options)
        self._tree = app_commands.CommandTree(client)
        self._tree.add_command(self._build_group())
        self._tree.error(self._on_tree_error)
        return client

    async def start(self) -> None:
        token = self._settings.discord_token
        if token is None or not token.get_secret_value().strip():
            raise StartupError(
                "Set DISCORD_TOKEN (environment or .env) to run the Discord adapter."
            )
        self._endpoints.apply(
            self._settings.discord_api_base_url, self._settings.discord_gateway_url
        )
        client = self._client = self._build_client()
        self._log_triggers()
        try:
            await client.start(token.get_secret_value().strip(), reconnect=True)
        except discord.PrivilegedIntentsRequired:
            raise StartupError(INTENTS_HELP) from None
        except discord.LoginFailure:
            raise StartupError(TOKEN_HELP) from None
        except discord.ConnectionClosed as exc:
            if exc.code in _CLOSE_CODE_HELP:
                raise StartupError(_CLOSE_CODE_HELP[exc.code]) from None
            raise
        except (aiohttp.ClientError, OSError, discord.HTTPException) as exc:
            # Once connected, discord.py retries these itself; one escaping before the
            # first READY is the login failing, which it does not retry.
            if self._ready.is_set():
                raise
            raise StartupError(self._login_failed(exc)) from None
        finally:
            if not client.is_closed():
                await client.close()
            self._endpoints.restore()

    def _login_failed(self, exc: Exception) -> str:
        """One line for a login that never reached Discord or got no usable answer."""
        if "discord_api_base_url" in self._settings.model_fields_set:
            where = f"DISCORD_API_BASE_URL={self._settings.discord_api_base_url}"
        else:
            where = f"{self._settings.discord_api_base_url} (DISCORD_API_BASE_URL unset)"
        if isinstance(exc, discord.HTTPException):
            return (
                f"Discord's API at {where} answered {exc.status} {exc.text[:80]!r} to the "
                "login: check DISCORD_API_BASE_URL, or try again if Discord is down"
            )
        why = connection_failure(exc) or " ".join(f"{type(exc).__name__}: {exc}".split())[:160]
        return f"could not reach Discord at {where} ({why}); check the network and the address"

    async def close(self) -> None:
        client = self._client
        if client is not None and not client.is_closed():
            await client.close()
        self._endpoints.restore()

    async def _setup_hook(self) -> None:
        """Sync /sonality once per start: to the dev guild (instant) or globally."""
        assert self._tree is not None
        dev_guild = self._settings.discord_dev_guild_id
        try:
            if dev_guild is not None:
                target = discord.Object(id=dev_guild)
                self._tree.copy_global_to(guild=target)
                synced = await self._tree.sync(guild=target)
            else:
                synced = await self._tree.sync()
        except discord.HTTPException as exc:
            # 50001 here means the bot is not in DISCORD_DEV_GUILD_ID or was invited
            # without the applications.commands scope; chat still works without /sonality.
            log.error(
                "Discord: could not sync /sonality commands (guild %s): %s %s %s",
                dev_guild or "global",
                exc.status,
                exc.code,
                exc.text,
            )
        else:
            log.info(
                "Discord: synced %d command(s) %s",
                len(synced),
                f"to guild {dev_guild}" if dev_guild else "globally",
            )

    # ------------------------------------------------------------------ messages
    async def _on_guild_membership(self, guild: discord.Guild, *, removed: bool) -> None:
        """Tell the runtime the bot left or (re)joined a guild; never raises into
        discord.py's dispatcher."""
        community_id = f"{PLATFORM}:{guild.id}"
        try:
            if removed:
                await self._runtime.community_removed(
                    community_id, "removed from the Discord server"
                )
            else:
                await self._runtime.community_added(community_id)
        except Exception:
            log.exception(
                "could not record the bot %s %s", "leaving" if removed else "joining", community_id
            )

    async def _removed_while_offline(self) -> None:
        """Discord does not repeat a removal that happened while the bot was offline,
        but READY lists every guild the bot is in (an outage shows as unavailable, not
        missing). So a guild the bot keeps data for that READY left out, and that one
        of this client's shards would carry, counts as removed. Never raises."""
        client = self._client
        if client is None:
            return
        count = client.shard_count or 1
        if isinstance(client, discord.AutoShardedClient):
            shards = set(client.shards)
        else:
            shards = {client.shard_id or 0}
        present = {guild.id for guild in client.guilds}
        try:
            for community_id in await self._runtime.known_communities(PLATFORM):
                raw = community_id.removeprefix(f"{PLATFORM}:")
                if not raw.isdigit():  # a DM's personality
                    continue
                guild_id = int(raw)
                if guild_id in present or (guild_id >> 22) % count not in shards:
                    continue
                await self._runtime.community_removed(
                    community_id, "not among Discord's guilds at connect (removed while offline)"
                )
        except Exception:
            log.exception("Discord: could not check for removals while offline")

    async def _on_message(self, message: discord.Message) -> None:
        incoming = self.to_incoming(message)
        if incoming is None:
            await self._person_wrote(message)
            return
        guild_id = message.guild.id if message.guild else None
        # The answer starts before the typing indicator's first request returns: that
        # round trip to Discord need not sit in front of every reply. The indicator
        # shows only once the runtime has decided to answer, never for a message it
        # stays silent on (chatter in a mention channel, anything in an `off` one).
        stream = StreamedReply(message)
        started = asyncio.Event()

        async def on_start() -> None:
            started.set()

        handling = asyncio.create_task(
            self._handle_with_images(message, incoming, stream, on_start)
        )
        try:
            deciding = asyncio.create_task(started.wait())
            try:
                await asyncio.wait({handling, deciding}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                deciding.cancel()
            async with contextlib.AsyncExitStack() as stack:
                if started.is_set():
                    try:
                        await stack.enter_async_context(message.channel.typing())
                    except discord.HTTPException as exc:
                        _log_discord_error("typing", exc, guild_id, message.channel.id)
                reply = await handling
        except Exception:
            await stream.stop()
            log.exception(
                "Discord: runtime failed on message %s (guild %s, channel %s)",
                message.id,
                guild_id,
                message.channel.id,
            )
            return
        if reply is not None and reply.streamed:
            await stream.finish(reply)
        elif reply is not None:
            await self._send_reply(message, reply)

    async def _handle_with_images(
        self,
        message: discord.Message,
        incoming: IncomingMessage,
        stream: StreamedReply,
        on_start: Started,
    ) -> Reply | None:
        """The runtime's answer; the message's images are fetched from the CDN once the
        runtime has let it through (`attach`). A message that did not address the bot
        (a free channel's) is handed over without them: no picture is downloaded for a
        message the bot may well not answer."""
        files = [
            AttachedFile(a.filename, a.url, a.size, a.content_type) for a in message.attachments
        ]

        async def attach(incoming: IncomingMessage) -> IncomingMessage:
            return await self._images.attach(incoming, files)

        return await self._runtime.handle(
            incoming,
            on_text=stream.feed,
            on_start=on_start,
            attach=attach if files and incoming.addressed else None,
        )

    async def _on_deleted(
        self, guild_id: int | None, message_ids: Sequence[int], cached: discord.Message | None
    ) -> None:
        """Messages were deleted: the runtime takes back what it kept of them. Discord
        does not say who deleted them (see bot/deletion.py). In a DM only a cached
        message tells whose DM it was; the runtime finds a kept answer without that.
        Never raises into discord.py's dispatcher."""
        community_id: str | None = None
        if guild_id is not None:
            community_id = f"{PLATFORM}:{guild_id}"
        elif cached is not None and not cached.author.bot:
            community_id = dm_community_id(PLATFORM, str(cached.author.id))

        async def take_back(message_id: int) -> None:
            try:
                await self._runtime.message_deleted(PLATFORM, str(message_id), community_id)
            except Exception:
                log.exception(
                    "Discord: could not take back deleted message %s (guild %s)",
                    message_id,
                    guild_id,
                )

        # At once, not one after another: a bulk delete's messages then wait for the
        # community's agent together, and it takes them back in one replay.
        await asyncio.gather(*(take_back(message_id) for message_id in message_ids))

    async def _on_edited(
        self, message: discord.Message, before: discord.Message | None = None
    ) -> None:
        """A member edited a message: if the bot answered it and the words changed, the
        old words are taken back and the message is answered again as a new one (see
        bot/deletion.py). The bot's own edits (a streamed reply) and updates that are no
        edit (a link preview arriving: no edited timestamp; or, on a message edited
        before, content as Discord holds it unchanged since `before`, the cached copy,
        however its mentions would render now) are left alone."""
        me = self._client.user if self._client is not None else None
        if message.author.bot or (me is not None and message.author.id == me.id):
            return
        if message.edited_at is None:
            return
        if before is not None and before.content == message.content:
            return
        incoming = self.to_incoming(message)
        try:
            anew = await self._runtime.message_edited(
                PLATFORM, str(message.id), incoming.text if incoming is not None else None
            )
        except Exception:
            log.exception("Discord: could not take back edited message %s", message.id)
            return
        if anew:
            await self._on_message(message)

    def to_incoming(self, message: discord.Message) -> IncomingMessage | None:
        """The neutral message for `message`, or None when the bot should stay silent."""
        client = self._client
        me = client.user if client is not None else None
        author = message.author
        if me is None or author.id == me.id or message.webhook_id is not None:
            return None
        if message.type not in (discord.MessageType.default, discord.MessageType.reply):
            return None  # joins, pins, thread starters: nothing was said to the bot
        guild = message.guild
        if guild is None:
            if (
                author.bot
                or not self._settings.discord_allow_dms
                or not isinstance(message.channel, discord.DMChannel)
            ):
                return None
            community = _community(None, "", author)
            addressed = True
        elif author.bot:
            if not self._answers_bot(message, me.id):
                return None
            community = _community(guild.id, guild.name, author)
            addressed = True
        else:
            # Handed over either way: in a free channel the runtime answers it too.
            # Without the Message Content intent Discord sends such a message without
            # its text (and attachments), so it ends here as empty.
            addressed = self._addresses_bot(message, me.id)
            community = _community(guild.id, guild.name, author)
        text = clean_text(self.clean_text(message, me.id)).strip()
        if not text and not message.attachments:
            return None
        channel = message.channel
        channel_id, thread_id = channel.id, None
        if isinstance(channel, discord.Thread):
            channel_id, thread_id = channel.parent_id, str(channel.id)
        return IncomingMessage(
            community=community,
            channel_id=str(channel_id),
            thread_id=thread_id,
            message_id=str(message.id),
            user=User(id=str(author.id), name=clean_name(author.display_name), is_bot=author.bot),
            text=text,
            addressed=addressed,
        )

    def _answers_bot(self, message: discord.Message, bot_id: int) -> bool:
        """Whether `message`, from another bot, is one to answer: a bot the operator
        listed (SONALITY_ANSWER_BOTS) that really pinged us. A mention or reply whose
        ping it switched off is not enough, so a bot that keeps its replies quiet, as
        we do, never sets us off."""
        return str(message.author.id) in self._answer_bots and any(
            u.id == bot_id for u in message.mentions
        )

    async def _person_wrote(self, message: discord.Message) -> None:
        """A person's message the bot does not answer still ends the bots' run of replies
        in its channel (SONALITY_BOT_EXCHANGES); nothing to do unless bots are answered."""
        if (
            not self._answer_bots
            or message.guild is None
            or message.author.bot
            or message.webhook_id is not None
            or message.type not in (discord.MessageType.default, discord.MessageType.reply)
        ):
            return
        channel = message.channel
        channel_id = channel.parent_id if isinstance(channel, discord.Thread) else channel.id
        try:
            await self._runtime.person_wrote(f"{PLATFORM}:{message.guild.id}", str(channel_id))
        except Exception:
            log.exception("Discord: could not note a message in guild %s", message.guild.id)

    def _addresses_bot(self, message: discord.Message, bot_id: int) -> bool:
        """An @mention (user or the bot's own role) or a reply to the bot's message.

        `mentioned_in` is not used: it is also true for @everyone, which would make
        the bot answer every announcement.
        """
        if bot_id in message.raw_mentions or any(u.id == bot_id for u in message.mentions):
            return True
        guild = message.guild
        role = guild.self_role if guild is not None else None
        if role is not None and role.id in message.raw_role_mentions:
            return True
        ref = message.reference
        if ref is not None:
            resolved = ref.resolved or ref.cached_message
            if isinstance(resolved, discord.Message) and resolved.author.id == bot_id:
                return True
        return False

    def clean_text(self, message: discord.Message, bot_id: int) -> str:
        """Content as a person reads it: the bot's own mention removed, other users,
        roles and channels as @name / #name (the model cannot resolve raw ids)."""
        guild = message.guild
        self_role = guild.self_role if guild is not None else None
        mentioned = {u.id: u for u in message.mentions}
        text = message.content
        own = rf"<@!?{bot_id}>" + (rf"|<@&{self_role.id}>" if self_role is not None else "")
        text = re.sub(rf"[ \t]*(?:{own})[ \t]*", " ", text)

        def user_name(match: re.Match[str]) -> str:
            uid = int(match.group(1))
            who = mentioned.get(uid) or (guild.get_member(uid) if guild is not None else None)
            return f"@{who.display_name}" if who is not None else "@unknown-user"

        def role_name(match: re.Match[str]) -> str:
            role = guild.get_role(int(match.group(1))) if guild is not None else None
            return f"@{role.name}" if role is not None else "@unknown-role"

        def channel_name(match: re.Match[str]) -> str:
            found = guild.get_channel_or_thread(int(match.group(1))) if guild is not None else None
            return f"#{found.name}" if found is not None else "#unknown-channel"

        text = _USER_MENTION.sub(user_name, text)
        text = _ROLE_MENTION.sub(role_name, text)
        text = _CHANNEL_MENTION.sub(channel_name, text)
        # "@Sonality, what do you think" → "what do you think"
        return text.strip().lstrip(",:;").strip()

    async def _send_reply(self, message: discord.Message, reply: Reply) -> None:
        """Each chunk as a Discord reply to the trigger, pinging nobody.

        fail_if_not_exists=False: if the trigger was deleted while the model thought,
        the answer still arrives as a plain message instead of a 400.
        """
        reference = message.to_reference(fail_if_not_exists=False)
        for chunk in split_message(reply.text, MESSAGE_LIMIT):
            try:
                await message.channel.send(
                    chunk,
                    reference=reference,
                    allowed_mentions=NO_MENTIONS,
                    mention_author=False,
                )
            except discord.HTTPException as exc:
                _log_discord_error(
                    f"{reply.kind} reply",
                    exc,
                    message.guild.id if message.guild else None,
                    message.channel.id,
                )
                return

    # ------------------------------------------------------------------ commands
    def _build_group(self) -> app_commands.Group:
        return build_group(
            allow_dms=self._settings.discord_allow_dms,
            run=self._run_command,
            choices=self._choices,
        )

    def is_moderator(self, interaction: discord.Interaction) -> bool:
        """Manage Server in this channel; in a DM, only if the operator lets DM members
        moderate their own DM personality (SONALITY_DM_MODERATION)."""
        if interaction.guild_id is None:
            return self._settings.dm_moderation
        perms = interaction.permissions
        return perms.manage_guild or perms.administrator

    @staticmethod
    def _community(interaction: discord.Interaction) -> Community:
        guild = interaction.guild
        name = guild.name if guild is not None else ""
        return _community(interaction.guild_id, name, interaction.user)

    async def _choices(
        self, interaction: discord.Interaction, kind: Literal["version", "topic"], current: str
    ) -> list[str]:
        try:
            async with asyncio.timeout(AUTOCOMPLETE_TIMEOUT):
                found = await self._runtime.complete(
                    self._community(interaction), kind, clean_command(str(current or ""))
                )
        except Exception:
            log.exception(
                "Discord: autocomplete for %s failed (guild %s)", kind, interaction.guild_id
            )
            return []
        return list(found)[:25]

    async def _run_command(
        self, interaction: discord.Interaction, name: str, args: Sequence[str]
    ) -> None:
        """Defer first (Discord's 3 s deadline), run, then edit the deferred response.

        A non-moderator calling a moderator command is deferred ephemerally because the
        refusal should only be seen by them, and an ephemeral flag cannot be added later.
        A command about the caller alone (`PRIVATE_COMMANDS`) is always deferred so.
        """
        if interaction.guild_id is None and not self._settings.discord_allow_dms:
            # Only a registration from when DMs were allowed still offers the command
            # here (one synced to a development guild is never replaced).
            try:
                await interaction.response.send_message(
                    DMS_OFF, ephemeral=True, allowed_mentions=NO_MENTIONS
                )
            except discord.HTTPException as exc:
                _log_discord_error(f"/sonality {name} in a DM", exc, None, interaction.channel_id)
            return
        moderator = self.is_moderator(interaction)
        ephemeral = (needs_moderator(name, tuple(args)) and not moderator) or (
            name in PRIVATE_COMMANDS
        )
        channel_id = interaction.channel_id
        try:
            await interaction.response.defer(thinking=True, ephemeral=ephemeral)
        except discord.HTTPException as exc:
            _log_discord_error(f"/sonality {name} defer", exc, interaction.guild_id, channel_id)
            return
        where, where_name = _command_channel(interaction)
        request = CommandRequest(
            community=self._community(interaction),
            caller=User(
                id=str(interaction.user.id), name=clean_name(interaction.user.display_name)
            ),
            is_moderator=moderator,
            name=name,
            args=tuple(clean_command(arg) for arg in args),
            channel_id=where,
            channel_name=where_name,
            free_refusal="" if self._settings.discord_message_content else FREE_NEEDS_INTENT,
        )
        try:
            result = await self._runtime.run_command(request)
        except Exception:
            log.exception(
                "Discord: /sonality %s failed (guild %s, channel %s)",
                name,
                interaction.guild_id,
                channel_id,
            )
            result = CommandResult(text=INTERNAL_ERROR, ok=False, private=True)
        view = self._confirm_view(interaction, request, result) if result.confirm_args else None
        try:
            await self._deliver(interaction, name, result, ephemeral, view=view)
        except discord.HTTPException as exc:
            _log_discord_error(f"/sonality {name} response", exc, interaction.guild_id, channel_id)

    def _confirm_view(
        self, question: discord.Interaction, request: CommandRequest, result: CommandResult
    ) -> ConfirmView:
        """Confirm / Cancel under `result`'s question; Confirm runs `request` again with
        the confirming arguments and shows its answer in place of the question."""
        confirmed = request.model_copy(update={"args": result.confirm_args})

        async def on_confirm(pressed: discord.Interaction) -> None:
            try:
                answer = await self._runtime.run_command(confirmed)
            except Exception:
                log.exception(
                    "Discord: confirmed /sonality %s failed (guild %s)",
                    request.name,
                    pressed.guild_id,
                )
                answer = CommandResult(text=INTERNAL_ERROR, ok=False, private=True)
            try:
                await self._deliver(pressed, request.name, answer, True)
            except discord.HTTPException as exc:
                _log_discord_error(
                    f"/sonality {request.name} confirmed",
                    exc,
                    pressed.guild_id,
                    pressed.channel_id,
                )

        return ConfirmView(
            owner_id=question.user.id,
            command=request.name,
            question=question,
            on_confirm=on_confirm,
            timeout=self.confirm_timeout,
        )

    async def _deliver(
        self,
        interaction: discord.Interaction,
        name: str,
        result: CommandResult,
        deferred_ephemeral: bool,
        *,
        view: discord.ui.View | None = None,
    ) -> None:
        heading = f"**{result.title}**\n" if result.title else ""
        shown = result.button_text if view is not None and result.button_text else result.text
        files, left_out = await asyncio.to_thread(
            fit_attachments, result.files, interaction.filesize_limit
        )
        text = heading + "\n".join([shown.strip() or "(nothing to show)", *left_out])
        if len(text) > ATTACH_THRESHOLD:
            files.append(discord.File(io.BytesIO(text.encode()), filename=f"sonality-{name}.txt"))
            chunks = [f"{heading}The full output is attached ({len(text):,} characters)."]
        else:
            chunks = split_message(text, MESSAGE_LIMIT)
        first, *rest = chunks
        ephemeral = deferred_ephemeral
        if result.private and not deferred_ephemeral:
            # The public "thinking…" cannot become private: remove it, answer privately.
            await interaction.delete_original_response()
            ephemeral = True
            await interaction.followup.send(
                first,
                files=files or MISSING,
                ephemeral=True,
                allowed_mentions=NO_MENTIONS,
                view=view or MISSING,
            )
        else:
            await interaction.edit_original_response(
                content=first,
                attachments=files or MISSING,  # MISSING: no attachments field at all
                allowed_mentions=NO_MENTIONS,
                view=view or MISSING,
            )
        for chunk in rest:
            await interaction.followup.send(
                chunk, ephemeral=ephemeral, allowed_mentions=NO_MENTIONS
            )

    async def _on_tree_error(
        self, interaction: discord.Interaction, error: app_commands.AppCommandError
    ) -> None:
        """Unknown or stale commands (e.g. an old sync) are logged and answered
        privately, never raised and never left unanswered."""
        await answer_command_error(interaction, error)


def _command_channel(interaction: discord.Interaction) -> tuple[str | None, str]:
    """The channel a command was run in, as messages name it: a thread's parent, so a
    mode set in a thread is its channel's. With its name, for lists."""
    channel = interaction.channel
    if isinstance(channel, discord.Thread):
        parent = channel.parent
        return str(channel.parent_id), clean_name(parent.name) if parent is not None else ""
    if interaction.channel_id is None:
        return None, ""
    return str(interaction.channel_id), clean_name(str(getattr(channel, "name", "") or ""))


def _log_discord_error(
    action: str, exc: discord.HTTPException, guild_id: int | None, channel_id: int | None
) -> None:
    """One log line an admin can act on: what failed, where, and Discord's code.

    A 429 arrives here as an HTTPException once discord.py's own retries are spent
    (it raises `RateLimited` only when `max_ratelimit_timeout` is set, which we don't).
    """
    hint = ""
    if isinstance(exc, discord.Forbidden):
        hint = " (missing access/permission: the bot needs View Channel, Send Messages, "
        hint += "Send Messages in Threads and Read Message History there)"
    log.warning(
        "Discord: %s failed with HTTP %s code %s (guild %s, channel %s): %s%s",
        action,
        exc.status,
        exc.code,
        guild_id,
        channel_id,
        exc.text,
        hint,
    )
