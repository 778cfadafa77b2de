"""A small fake Discord (REST + gateway) on 127.0.0.1 for driving the real discord.py.

Why a fake server instead of mocks: the adapter's correctness lives in what discord.py
actually puts on the wire (message_reference, allowed_mentions, interaction callbacks,
429 retries, close code 4014), so the test must let the real library talk to
something that speaks the same protocol. dpytest cannot do interactions.

Facts this server relies on (checked against discord.py 2.7.1):
- login calls GET /users/@me and GET /oauth2/applications/@me; a plain Client never
  calls GET /gateway/bot (AutoShardedClient without shard_count does, and connects to
  the url it returns).
- discord.py parses a REST body as JSON only when Content-Type is exactly
  "application/json"; aiohttp's json_response appends "; charset=utf-8", after which
  login fails. Every JSON response here sets the header by hand.
- A 429 is retried only when it carries a `Via` header (no Via = Cloudflare ban).
- Interaction and webhook routes carry no Authorization header; every other route
  answers 401 `{"message": "401: Unauthorized", "code": 0}` to a token that is not
  `token`, and an IDENTIFY with another token is closed with 4004, as Discord does.
- A MESSAGE_CREATE with "message_reference": null breaks parsing: omit the key.
- MESSAGE_UPDATE carries the whole message (discord.py 2.5+ builds a Message from it),
  with `edited_timestamp` set by an edit and unchanged by an embed arriving, and is
  stripped of content like MESSAGE_CREATE for a session without Message Content.
  MESSAGE_DELETE and MESSAGE_DELETE_BULK carry only ids, channel and guild: never the
  author, the content, or who deleted the message.
- The gateway may answer in text frames even when the client asked for zlib-stream.
- Attachments live on the CDN, which this server plays on its own host (so the bot is
  configured with one address, DISCORD_API_BASE_URL): `attachment()` makes the object a
  message carries, with a signed URL as Discord's CDN has given since 2024
  (`?ex=…&is=…&hm=…`); a request with a wrong or missing signature gets the CDN's 404
  "This content is no longer available." The CDN takes no token, and every request to
  it is in `cdn_requests`.
- Interactions follow Discord's response rules: the first callback must arrive within
  3 s of the interaction (later: 404 "Unknown interaction", code 10062), only one
  callback per interaction (a second: 400 code 40060), and the interaction token's
  webhook (@original edits, follow-ups) works only after that callback and for 15
  minutes. A button press (MESSAGE_COMPONENT, type 3) may also be answered by updating
  the message it is on (callback types 6 and 7), and its @original is that message.
- A message with no text (blanks are none) and no embed, file, attachment, sticker,
  component or poll, sent, edited into one, or sent as an interaction answer, is
  Discord's 400 "Cannot send an empty message" (code 50006); content over 2,000
  characters is its 400 BASE_TYPE_MAX_LENGTH.
- A message the bot sends comes back to it as MESSAGE_CREATE (`echo_sent`), and its
  `mentions` are the users it really pinged, by its `allowed_mentions`, not every
  <@id> in the text.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import itertools
import json
import math
import re
import secrets
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from aiohttp import BodyPartReader, WSMsgType, web

JSONDict = dict[str, Any]

_DISCORD_EPOCH_MS = 1420070400000
_HEARTBEAT_INTERVAL_MS = 41250


MESSAGE_CONTENT_INTENT = 1 << 15


def _without_content(data: JSONDict, bot_id: int) -> JSONDict:
    """A message as a session without the Message Content intent receives it: empty
    content, embeds, attachments and components, unless it mentions the app or is a DM
    (Discord's documented exceptions)."""
    mentioned = any(str(u.get("id")) == str(bot_id) for u in data.get("mentions") or [])
    if mentioned or "guild_id" not in data:
        return data
    return {**data, "content": "", "embeds": [], "attachments": [], "components": []}


def _valid_shard(shard: list[Any]) -> bool:
    """IDENTIFY's `shard: [id, count]` as Discord accepts it (else close code 4010)."""
    if len(shard) != 2 or not all(isinstance(x, int) for x in shard):
        return False
    shard_id, count = shard
    return count >= 1 and 0 <= shard_id < count


def _now_iso() -> str:
    return datetime.now(UTC).isoformat()


def _member() -> JSONDict:
    """A guild member's fields besides `user` (roles, nick, ...): the same for everyone."""
    return {
        "roles": [],
        "joined_at": _now_iso(),
        "deaf": False,
        "mute": False,
        "flags": 0,
        "nick": None,
    }


def json_response(
    payload: Any, status: int = 200, headers: dict[str, str] | None = None
) -> web.Response:
    """JSON with Content-Type exactly application/json (see module docstring)."""
    all_headers = {"Content-Type": "application/json"}
    all_headers.update(headers or {})
    return web.Response(body=json.dumps(payload).encode(), status=status, headers=all_headers)


@dataclass
class RecordedRequest:
    method: str
    path: str
    query: dict[str, str]
    headers: dict[str, str]
    json: Any
    files: list[tuple[str, bytes]] = field(default_factory=list)


@dataclass
class FakeUser:
    id: int
    username: str
    global_name: str | None = None
    bot: bool = False

    def payload(self) -> JSONDict:
        return {
            "id": str(self.id),
            "username": self.username,
            "global_name": self.global_name,
            "discriminator": "0",
            "avatar": None,
            "bot": self.bot,
        }


@dataclass
class FakeChannel:
    id: int
    name: str = "general"
    parent_id: int | None = None  # set for a thread

    @property
    def is_thread(self) -> bool:
        return self.parent_id is not None


@dataclass
class FakeGuild:
    id: int
    name: str
    channels: list[FakeChannel] = field(default_factory=list)
    members: list[FakeUser] = field(default_factory=list)


@dataclass
class CdnFile:
    """A file on the fake CDN: its bytes, and the Content-Type the CDN serves it with
    (what the upload said, unless a test makes the two differ)."""

    data: bytes
    served_type: str


@dataclass
class FakeInteraction:
    """An interaction the fake sent, and what the bot has answered to it."""

    id: int
    token: str
    type: int  # 2 application command, 3 message component, 4 autocomplete
    created: float  # time.monotonic()
    channel_id: int
    responded: bool = False
    #: The @original message: the response (types 4, 5), or the message a pressed
    #: button is on (for a component interaction, from the start).
    message: JSONDict | None = None


#: Callback types Discord accepts for each interaction type.
_CALLBACK_TYPES = {2: {4, 5, 9}, 3: {4, 5, 6, 7, 9}, 4: {8}}


#: The largest file Discord takes in a server without boosts, as interactions announce it
#: (`attachment_size_limit`); a larger one is refused with 413, code 40005.
ATTACHMENT_SIZE_LIMIT = 8 * 1024 * 1024


class FakeDiscord:
    """One fake Discord: start(), point the client at api_base / gateway_url, script it."""

    def __init__(self) -> None:
        self._ids = itertools.count(1)
        self.bot = FakeUser(self.snowflake(), "sonality", "Sonality", bot=True)
        self.application_id = self.bot.id
        self.owner = FakeUser(self.snowflake(), "owner")
        self.guilds: list[FakeGuild] = []
        self.requests: list[RecordedRequest] = []
        self.identifies: list[JSONDict] = []
        self.messages: dict[int, JSONDict] = {}
        #: Interactions sent, by token, and the interaction responses (ephemeral ones
        #: included) by message id.
        self.interactions: dict[str, FakeInteraction] = {}
        self.interaction_messages: dict[int, JSONDict] = {}
        self.response_deadline = 3.0  # seconds to the first callback, as on Discord
        self.token_lifetime = 15 * 60.0
        self.close_with_4014 = False
        # The portal's "Message Content Intent" switch: a session asking for the intent
        # while it is off is closed with 4014, as Discord does.
        self.message_content_allowed = True
        self._intents: dict[int, int] = {}  # id(ws) -> the intents it identified with
        self.token = "test-token"  # bot routes answer 401 to any other token
        # Scripted answers for the next POST /channels/{id}/messages: (status, body, headers).
        self._message_faults: list[tuple[int, JSONDict, dict[str, str]]] = []
        #: When set, POST /channels/{id}/typing is answered only once this event is set.
        self.typing_gate: asyncio.Event | None = None
        # Message edits (PATCH /channels/{id}/messages/{id}) are rate limited per channel
        # as Discord does: `edit_limit` per `edit_window` seconds, announced in the
        # X-RateLimit-* headers, and a 429 with `retry_after` past it.
        self.edit_limit = 5
        self.edit_window = 5.0
        self._edit_buckets: dict[int, list[float]] = {}
        #: (message id, content) of every accepted edit, in order.
        self.edits: list[tuple[int, str]] = []
        #: When each accepted edit arrived (time.monotonic()), parallel to `edits`.
        self.edit_times: list[float] = []
        #: Edits refused with 429 (discord.py waits and retries them).
        self.rate_limited_edits = 0
        #: What GET /gateway/bot recommends; AutoShardedClient without a count uses it.
        self.recommended_shards = 1
        #: Discord sends a bot its own messages too (MESSAGE_CREATE); off, only the
        #: messages a test creates are dispatched.
        self.echo_sent = True
        self._sessions: list[tuple[web.WebSocketResponse, list[int]]] = []  # ws, [shard, count]
        self._seq = itertools.count(1)
        self._changed = asyncio.Event()
        self._runner: web.AppRunner | None = None
        self.port = 0
        #: CDN path -> the file served there, and every request the CDN got.
        self.cdn_files: dict[str, CdnFile] = {}
        self.cdn_requests: list[RecordedRequest] = []
        self._cdn_secret = secrets.token_hex(16)

    # ------------------------------------------------------------------ lifecycle
    def snowflake(self) -> int:
        """Increasing ids shaped like real snowflakes (discord.py derives created_at)."""
        ms = int(datetime.now(UTC).timestamp() * 1000) - _DISCORD_EPOCH_MS
        return (ms << 22) | (next(self._ids) & 0x3FFFFF)

    def add_guild(
        self,
        name: str,
        *,
        channels: int = 1,
        members: list[FakeUser] | None = None,
        shard: tuple[int, int] | None = None,
    ) -> FakeGuild:
        """`shard=(id, count)`: a guild id that Discord's rule puts on that shard."""
        guild_id = self.snowflake()
        if shard is not None:
            shard_id, count = shard
            timestamp = guild_id >> 22
            timestamp += (shard_id - timestamp) % count  # (id >> 22) % count == shard_id
            guild_id = (timestamp << 22) | (guild_id & 0x3FFFFF)
        guild = FakeGuild(guild_id, name)
        for i in range(channels):
            guild.channels.append(FakeChannel(self.snowflake(), f"channel-{i}"))
        guild.members = [self.bot, *(members or [])]
        self.guilds.append(guild)
        return guild

    def add_thread(
        self, guild: FakeGuild, parent: FakeChannel, name: str = "a-thread"
    ) -> FakeChannel:
        thread = FakeChannel(self.snowflake(), name, parent_id=parent.id)
        guild.channels.append(thread)
        return thread

    async def start(self) -> None:
        app = web.Application()
        app.router.add_route("GET", "/gateway", self._gateway)
        app.router.add_route("*", "/api/v10/{tail:.*}", self._rest)
        app.router.add_get("/attachments/{channel}/{id}/{name}", self._cdn)
        self._runner = web.AppRunner(app, handle_signals=False)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        server = site._server
        assert server is not None and server.sockets  # type: ignore[attr-defined]
        self.port = server.sockets[0].getsockname()[1]  # type: ignore[attr-defined]

    async def close(self) -> None:
        for ws, _ in list(self._sessions):
            with contextlib.suppress(Exception):
                await ws.close()
        if self._runner is not None:
            await self._runner.cleanup()

    @property
    def api_base(self) -> str:
        return f"http://127.0.0.1:{self.port}/api/v10"

    @property
    def gateway_url(self) -> str:
        return f"ws://127.0.0.1:{self.port}/gateway"

    # ------------------------------------------------------------------ CDN
    def attachment(
        self,
        channel: FakeChannel,
        filename: str,
        data: bytes,
        *,
        content_type: str | None = "image/png",
        served_type: str | None = None,
        size: int | None = None,
    ) -> JSONDict:
        """An attachment object for a message, its file put on the CDN. `served_type`
        (default `content_type`) is the CDN's Content-Type; `size` (default the real
        one) what the object claims."""
        attachment_id = self.snowflake()
        path = f"/attachments/{channel.id}/{attachment_id}/{filename}"
        self.cdn_files[path] = CdnFile(data, served_type or content_type or "")
        url = f"http://127.0.0.1:{self.port}{path}?{self._signature(path)}"
        payload: JSONDict = {
            "id": str(attachment_id),
            "filename": filename,
            "size": len(data) if size is None else size,
            "url": url,
            "proxy_url": url,
        }
        if content_type is not None:
            payload["content_type"] = content_type
        return payload

    def _signature(self, path: str) -> str:
        """The query of a signed CDN link: expiry, issue time (hex seconds), signature."""
        expires, issued = f"{int(time.time()) + 86_400:x}", f"{int(time.time()):x}"
        return f"ex={expires}&is={issued}&hm={self._signature_of(path, expires, issued)}"

    async def _cdn(self, request: web.Request) -> web.Response:
        recorded = RecordedRequest(
            request.method, request.path, dict(request.query), dict(request.headers), None
        )
        self.cdn_requests.append(recorded)
        self._notify()
        found = self.cdn_files.get(request.path)
        query = request.query
        expected = None
        if found is not None and {"ex", "is", "hm"} <= set(query):
            expected = self._signature_of(request.path, query["ex"], query["is"])
        if found is None or expected != query.get("hm") or int(query["ex"], 16) < time.time():
            return web.Response(status=404, text="This content is no longer available.")
        return web.Response(body=found.data, headers={"Content-Type": found.served_type})

    def _signature_of(self, path: str, expires: str, issued: str) -> str:
        return hashlib.sha256(f"{self._cdn_secret}{path}{expires}{issued}".encode()).hexdigest()

    # ------------------------------------------------------------------ scripting
    def fail_next_messages_with_429(self, count: int = 1, retry_after: float = 0.05) -> None:
        """The next `count` POST .../messages get a 429 that discord.py will retry.

        The `Via` header matters: without it discord.py treats a 429 as a Cloudflare
        ban and raises instead of waiting `retry_after`.
        """
        body = {
            "message": "You are being rate limited.",
            "retry_after": retry_after,
            "global": False,
        }
        headers = {
            "Via": "1.1 google",
            "Retry-After": str(retry_after),
            "X-RateLimit-Scope": "user",
        }
        self._message_faults.extend([(429, body, headers)] * count)

    def fail_next_messages_with(self, status: int, *, code: int, message: str) -> None:
        """The next POST .../messages fails with a Discord error body (e.g. 403/50001)."""
        self._message_faults.append((status, {"message": message, "code": code}, {}))

    def find(self, method: str, path_contains: str = "") -> list[RecordedRequest]:
        return [r for r in self.requests if r.method == method and path_contains in r.path]

    async def wait_for(
        self, predicate: Callable[[RecordedRequest], bool], *, seconds: float = 5.0, count: int = 1
    ) -> list[RecordedRequest]:
        """Wait until `count` recorded requests match; returns them."""
        async with asyncio.timeout(seconds):
            while True:
                found = [r for r in self.requests if predicate(r)]
                if len(found) >= count:
                    return found
                self._changed.clear()
                await self._changed.wait()

    def _notify(self) -> None:
        self._changed.set()

    # ------------------------------------------------------------------ payloads
    def _channel_payload(self, guild: FakeGuild, channel: FakeChannel, position: int) -> JSONDict:
        if channel.is_thread:
            return {
                "id": str(channel.id),
                "guild_id": str(guild.id),
                "parent_id": str(channel.parent_id),
                "owner_id": str(self.owner.id),
                "name": channel.name,
                "type": 11,
                "message_count": 0,
                "member_count": 1,
                "rate_limit_per_user": 0,
                "thread_metadata": {
                    "archived": False,
                    "auto_archive_duration": 1440,
                    "archive_timestamp": _now_iso(),
                    "locked": False,
                },
            }
        return {
            "id": str(channel.id),
            "guild_id": str(guild.id),
            "name": channel.name,
            "type": 0,
            "position": position,
            "permission_overwrites": [],
            "nsfw": False,
            "parent_id": None,
        }

    def guild_payload(self, guild: FakeGuild) -> JSONDict:
        members = [{"user": u.payload(), **_member()} for u in guild.members]
        return {
            "id": str(guild.id),
            "name": guild.name,
            "owner_id": str(self.owner.id),
            "unavailable": False,
            "member_count": len(members),
            "members": members,
            "channels": [
                self._channel_payload(guild, c, i)
                for i, c in enumerate(guild.channels)
                if not c.is_thread
            ],
            "threads": [self._channel_payload(guild, c, 0) for c in guild.channels if c.is_thread],
            "roles": [
                {
                    "id": str(guild.id),
                    "name": "@everyone",
                    "permissions": str(1 << 11 | 1 << 10),
                    "position": 0,
                    "color": 0,
                    "hoist": False,
                    "managed": False,
                    "mentionable": False,
                }
            ],
            "emojis": [],
            "stickers": [],
            "features": [],
            "presences": [],
            "voice_states": [],
            "large": False,
        }

    def _guild_of_channel(self, channel_id: int) -> FakeGuild | None:
        for guild in self.guilds:
            if any(c.id == channel_id for c in guild.channels):
                return guild
        return None

    def message_payload(
        self,
        *,
        channel_id: int,
        author: FakeUser,
        content: str,
        mentions: list[FakeUser] | None = None,
        reply_to: JSONDict | None = None,
        ping: bool = True,
        attachments: list[JSONDict] | None = None,
    ) -> JSONDict:
        """A message as Discord sends it. A reply pings its target by default, and
        Discord then lists the target among the mentions; `ping=False` is a reply with
        the ping switched off. `attachments` come from `attachment()`."""
        guild = self._guild_of_channel(channel_id)
        mentioned = [u.payload() for u in mentions or []]
        if reply_to is not None and ping:
            target = reply_to["author"]
            if all(str(m["id"]) != str(target["id"]) for m in mentioned):
                mentioned.append(target)
        data: JSONDict = {
            "id": str(self.snowflake()),
            "channel_id": str(channel_id),
            "author": author.payload(),
            "content": content,
            "timestamp": _now_iso(),
            "edited_timestamp": None,
            "tts": False,
            # as Discord sets it, so a test can tell @everyone from a mention of the bot
            "mention_everyone": "@everyone" in content or "@here" in content,
            "mentions": [{**u, **({"member": _member()} if guild else {})} for u in mentioned],
            "mention_roles": [],
            "attachments": list(attachments or []),
            "embeds": [],
            "pinned": False,
            "type": 19 if reply_to else 0,
            "flags": 0,
        }
        if guild is not None:
            data["guild_id"] = str(guild.id)
            data["member"] = _member()
        if reply_to is not None:  # omitted otherwise: a null breaks discord.py's parser
            data["message_reference"] = {
                "type": 0,
                "message_id": reply_to["id"],
                "channel_id": reply_to["channel_id"],
                **({"guild_id": str(guild.id)} if guild else {}),
            }
            data["referenced_message"] = reply_to
        return data

    # ------------------------------------------------------------------ dispatch
    async def dispatch(self, event: str, data: JSONDict, *, guild_id: int | None = None) -> None:
        """Send one DISPATCH (op 0) to the shard that owns guild_id (all shards if None)."""
        for ws, (shard_id, count) in list(self._sessions):
            if guild_id is not None and (guild_id >> 22) % count != shard_id:
                continue
            payload = data
            if (
                event in ("MESSAGE_CREATE", "MESSAGE_UPDATE")
                and not self._intents.get(id(ws), 0) & MESSAGE_CONTENT_INTENT
            ):
                payload = _without_content(data, self.bot.id)
            await ws.send_str(json.dumps({"op": 0, "t": event, "s": next(self._seq), "d": payload}))

    async def message_create(
        self,
        *,
        channel: FakeChannel,
        author: FakeUser,
        content: str,
        mentions: list[FakeUser] | None = None,
        reply_to: JSONDict | None = None,
        ping: bool = True,
        attachments: list[JSONDict] | None = None,
    ) -> JSONDict:
        data = self.message_payload(
            channel_id=channel.id,
            author=author,
            content=content,
            mentions=mentions,
            reply_to=reply_to,
            ping=ping,
            attachments=attachments,
        )
        self.messages[int(data["id"])] = data
        guild = self._guild_of_channel(channel.id)
        await self.dispatch("MESSAGE_CREATE", data, guild_id=guild.id if guild else None)
        return data

    async def message_edit(
        self, message: JSONDict, content: str, *, mentions: list[FakeUser] | None = None
    ) -> JSONDict:
        """The author edits `message` (as stored by `message_create`): Discord stores the
        new content, sets `edited_timestamp` and sends MESSAGE_UPDATE with the whole
        message (without its content to a session lacking the Message Content intent,
        unless it mentions the app). `mentions` are those of the new text."""
        data = {
            **self.messages[int(message["id"])],
            "content": content,
            "edited_timestamp": _now_iso(),
            "mentions": [
                {**u.payload(), **({"member": _member()} if "guild_id" in message else {})}
                for u in mentions or []
            ],
            "mention_everyone": "@everyone" in content or "@here" in content,
        }
        self.messages[int(message["id"])] = data
        guild_id = data.get("guild_id")
        await self.dispatch(
            "MESSAGE_UPDATE", data, guild_id=int(guild_id) if guild_id is not None else None
        )
        return data

    async def message_preview(self, message: JSONDict) -> JSONDict:
        """Discord resolves a link in `message` into an embed: MESSAGE_UPDATE with the
        whole message, its content and `edited_timestamp` unchanged."""
        data = {
            **self.messages[int(message["id"])],
            "embeds": [{"type": "link", "url": "https://example.org/", "title": "Example"}],
        }
        self.messages[int(message["id"])] = data
        guild_id = data.get("guild_id")
        await self.dispatch(
            "MESSAGE_UPDATE", data, guild_id=int(guild_id) if guild_id is not None else None
        )
        return data

    async def message_delete(self, message: JSONDict) -> None:
        """Someone deletes `message`: MESSAGE_DELETE carries only its id, channel and
        guild (never who deleted it, nor the content)."""
        self.messages.pop(int(message["id"]), None)
        data: JSONDict = {"id": message["id"], "channel_id": message["channel_id"]}
        if "guild_id" in message:
            data["guild_id"] = message["guild_id"]
        guild_id = message.get("guild_id")
        await self.dispatch(
            "MESSAGE_DELETE", data, guild_id=int(guild_id) if guild_id is not None else None
        )

    async def message_delete_bulk(self, messages: list[JSONDict]) -> None:
        """A moderator purges `messages` (all of one guild channel): MESSAGE_DELETE_BULK
        with their ids."""
        first = messages[0]
        assert all(m["channel_id"] == first["channel_id"] for m in messages)
        for message in messages:
            self.messages.pop(int(message["id"]), None)
        await self.dispatch(
            "MESSAGE_DELETE_BULK",
            {
                "ids": [m["id"] for m in messages],
                "channel_id": first["channel_id"],
                "guild_id": first["guild_id"],
            },
            guild_id=int(first["guild_id"]),
        )

    async def remove_bot(self, guild: FakeGuild) -> None:
        """The bot is kicked (or the guild deleted): Discord drops the guild and sends
        GUILD_DELETE with an unavailable-guild object WITHOUT `unavailable`, which is
        what tells a removal from an outage. Its channels are unknown to the bot after."""
        self.guilds.remove(guild)
        await self.dispatch("GUILD_DELETE", {"id": str(guild.id)}, guild_id=guild.id)

    async def guild_outage(self, guild: FakeGuild) -> None:
        """An outage: GUILD_DELETE with `unavailable: true`; the bot is still a member."""
        await self.dispatch(
            "GUILD_DELETE", {"id": str(guild.id), "unavailable": True}, guild_id=guild.id
        )

    async def add_bot(self, guild: FakeGuild) -> None:
        """The bot is invited (back): the full guild in GUILD_CREATE, as on a join."""
        if guild not in self.guilds:
            self.guilds.append(guild)
        await self.dispatch("GUILD_CREATE", self.guild_payload(guild), guild_id=guild.id)

    async def interaction_create(
        self,
        *,
        guild: FakeGuild | None,
        channel: FakeChannel,
        user: FakeUser,
        subcommand: str,
        options: list[JSONDict] | None = None,
        permissions: int = 0,
        autocomplete: bool = False,
        command: str = "sonality",
    ) -> tuple[int, str]:
        """Send a /sonality <subcommand> INTERACTION_CREATE; returns (interaction id, token).

        Discord delivers whatever its registration (possibly an older one) offered, so
        `subcommand`, `command` and `options` may name what the bot no longer has, or
        leave out an option it now requires. `guild=None` is the user's DM with the bot
        (context 1): Discord sends it only for a command registered for DMs, with the
        caller as `user` (no member, no permissions), as it does."""
        interaction_id = self.snowflake()
        token = f"tok-{interaction_id}"
        kind = 4 if autocomplete else 2
        self.interactions[token] = FakeInteraction(
            interaction_id, token, kind, time.monotonic(), channel.id
        )
        data: JSONDict = {
            "id": str(interaction_id),
            "application_id": str(self.application_id),
            "type": kind,
            "token": token,
            "version": 1,
            "channel_id": str(channel.id),
            "app_permissions": str((1 << 53) - 1),
            "locale": "en-US",
            "attachment_size_limit": ATTACHMENT_SIZE_LIMIT,
            "entitlements": [],
            "data": {
                "id": str(self.snowflake()),
                "name": command,
                "type": 1,
                "options": [{"name": subcommand, "type": 1, "options": options or []}],
            },
        }
        if guild is None:
            assert self._offered_in_dms(command), f"/{command} is not registered for DMs"
            data.update(
                channel={
                    "id": str(channel.id),
                    "type": 1,
                    "last_message_id": None,
                    "flags": 0,
                    "recipients": [user.payload()],
                },
                user=user.payload(),
                authorizing_integration_owners={"0": "0"},
                context=1,
            )
        else:
            data.update(
                guild_id=str(guild.id),
                channel=self._channel_payload(guild, channel, 0),
                member={"user": user.payload(), **_member(), "permissions": str(permissions)},
                guild_locale="en-US",
                authorizing_integration_owners={"0": str(guild.id)},
                context=0,
            )
        await self.dispatch("INTERACTION_CREATE", data, guild_id=guild.id if guild else None)
        return interaction_id, token

    def _offered_in_dms(self, command: str) -> bool:
        """Whether the latest global registration offers `command` in the bot's DMs."""
        synced = [
            r
            for r in self.requests
            if r.method == "PUT" and r.path == f"/applications/{self.application_id}/commands"
        ]
        if not synced:
            return False
        registered = {c.get("name"): c for c in synced[-1].json or []}
        contexts = (registered.get(command) or {}).get("contexts") or []
        return 1 in contexts

    @staticmethod
    def buttons(message: JSONDict) -> dict[str, str]:
        """label -> custom_id of the enabled buttons on a message."""
        return {
            str(c.get("label")): str(c.get("custom_id"))
            for row in message.get("components") or []
            for c in row.get("components") or []
            if c.get("type") == 2 and not c.get("disabled") and c.get("custom_id")
        }

    async def press(
        self,
        *,
        guild: FakeGuild,
        user: FakeUser,
        message: JSONDict,
        label: str,
        permissions: int = 0,
    ) -> tuple[int, str]:
        """Press the button `label` on an interaction response `message`: a
        MESSAGE_COMPONENT INTERACTION_CREATE carrying the button's custom_id and the
        message as Discord sends it. Returns (interaction id, token). Only a button the
        message shows can be pressed."""
        stored = self.interaction_messages.get(int(message["id"]))
        assert stored is not None, "no such interaction response"
        custom_id = self.buttons(stored).get(label)
        assert custom_id is not None, f"no enabled button {label!r} on the message"
        interaction_id = self.snowflake()
        token = f"tok-{interaction_id}"
        channel_id = int(stored["channel_id"])
        channel = next(c for c in guild.channels if c.id == channel_id)
        self.interactions[token] = FakeInteraction(
            interaction_id, token, 3, time.monotonic(), channel_id, message=stored
        )
        data: JSONDict = {
            "id": str(interaction_id),
            "application_id": str(self.application_id),
            "type": 3,
            "token": token,
            "version": 1,
            "guild_id": str(guild.id),
            "channel_id": str(channel_id),
            "channel": self._channel_payload(guild, channel, 0),
            "member": {"user": user.payload(), **_member(), "permissions": str(permissions)},
            "app_permissions": str((1 << 53) - 1),
            "locale": "en-US",
            "guild_locale": "en-US",
            "attachment_size_limit": ATTACHMENT_SIZE_LIMIT,
            "entitlements": [],
            "authorizing_integration_owners": {"0": str(guild.id)},
            "context": 0,
            "message": stored,
            "data": {"custom_id": custom_id, "component_type": 2},
        }
        await self.dispatch("INTERACTION_CREATE", data, guild_id=guild.id)
        return interaction_id, token

    # ------------------------------------------------------------------ gateway
    async def _gateway(self, request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse(autoping=True)
        await ws.prepare(request)
        await ws.send_str(
            json.dumps({"op": 10, "d": {"heartbeat_interval": _HEARTBEAT_INTERVAL_MS}})
        )
        session: tuple[web.WebSocketResponse, list[int]] | None = None
        try:
            async for msg in ws:
                if msg.type != WSMsgType.TEXT:
                    continue
                payload = json.loads(msg.data)
                op = payload.get("op")
                if op == 1:  # heartbeat
                    await ws.send_str(json.dumps({"op": 11}))
                elif op == 2:  # identify
                    identify = payload["d"]
                    self.identifies.append(identify)
                    self._notify()
                    if identify.get("token") != self.token:
                        # Discord's answer to an IDENTIFY with a token it does not know.
                        await ws.close(code=4004, message=b"Authentication failed.")
                        break
                    intents = int(identify.get("intents") or 0)
                    wants_content = bool(intents & MESSAGE_CONTENT_INTENT)
                    if self.close_with_4014 or (wants_content and not self.message_content_allowed):
                        await ws.close(code=4014, message=b"Disallowed intent(s).")
                        break
                    shard = list(identify.get("shard") or [0, 1])
                    if not _valid_shard(shard):
                        await ws.close(code=4010, message=b"Invalid shard.")
                        break
                    self._intents[id(ws)] = intents
                    session = (ws, shard)
                    self._sessions.append(session)
                    await self._send_ready(ws, shard)
                elif op == 6:  # resume: not supported, make the client identify anew
                    await ws.send_str(json.dumps({"op": 9, "d": False}))
        finally:
            if session is not None and session in self._sessions:
                self._sessions.remove(session)
        return ws

    async def _send_ready(self, ws: web.WebSocketResponse, shard: list[int]) -> None:
        shard_id, count = shard
        mine = [g for g in self.guilds if (g.id >> 22) % count == shard_id]
        ready = {
            "v": 10,
            "user": self.bot.payload(),
            "guilds": [{"id": str(g.id), "unavailable": True} for g in mine],
            "session_id": f"session-{shard_id}",
            "resume_gateway_url": self.gateway_url,
            "application": {"id": str(self.application_id), "flags": 0},
            "shard": shard,
        }
        await ws.send_str(json.dumps({"op": 0, "t": "READY", "s": next(self._seq), "d": ready}))
        for guild in mine:
            await ws.send_str(
                json.dumps(
                    {
                        "op": 0,
                        "t": "GUILD_CREATE",
                        "s": next(self._seq),
                        "d": self.guild_payload(guild),
                    }
                )
            )

    # ------------------------------------------------------------------ REST
    async def _rest(self, request: web.Request) -> web.StreamResponse:
        path = "/" + request.match_info["tail"]
        body: Any = None
        files: list[tuple[str, bytes]] = []
        if request.content_type.startswith("multipart/"):
            reader = await request.multipart()
            async for part in reader:
                if not isinstance(part, BodyPartReader):
                    continue
                raw = await part.read()
                if part.name == "payload_json":
                    body = json.loads(raw)
                else:
                    files.append((part.filename or "", bytes(raw)))
        elif request.can_read_body:
            text = await request.text()
            body = json.loads(text) if text else None
        recorded = RecordedRequest(
            request.method, path, dict(request.query), dict(request.headers), body, files
        )
        self.requests.append(recorded)
        self._notify()
        webhook_route = path.startswith(("/interactions/", "/webhooks/"))
        if not webhook_route and recorded.headers.get("Authorization") != f"Bot {self.token}":
            return json_response({"message": "401: Unauthorized", "code": 0}, status=401)
        if any(len(data) > ATTACHMENT_SIZE_LIMIT for _, data in files):
            # As Discord: a file over the limit the interaction announced is refused whole.
            return json_response({"message": "Request entity too large", "code": 40005}, status=413)
        return await self._route(request.method, path, recorded)

    async def _route(self, method: str, path: str, req: RecordedRequest) -> web.StreamResponse:
        parts = path.strip("/").split("/")
        if method == "GET" and path == "/users/@me":
            return json_response(self.bot.payload())
        if method == "GET" and path == "/oauth2/applications/@me":
            return json_response(
                {
                    "id": str(self.application_id),
                    "name": self.bot.global_name,
                    "description": "",
                    "icon": None,
                    "bot_public": True,
                    "bot_require_code_grant": False,
                    "owner": self.owner.payload(),
                    "team": None,
                    "verify_key": "0" * 64,
                    "flags": 0,
                    "summary": "",
                }
            )
        if method == "GET" and path in ("/gateway/bot", "/gateway"):
            return json_response(
                {
                    "url": self.gateway_url,
                    "shards": self.recommended_shards,
                    "session_start_limit": {
                        "total": 1000,
                        "remaining": 1000,
                        "reset_after": 0,
                        "max_concurrency": 1,
                    },
                }
            )
        if method == "PUT" and parts[0] == "applications" and parts[-1] == "commands":
            return json_response(
                [
                    {
                        **cmd,
                        "id": str(self.snowflake()),
                        "application_id": str(self.application_id),
                        "version": str(self.snowflake()),
                        **({"guild_id": parts[3]} if len(parts) == 5 else {}),
                    }
                    for cmd in req.json or []
                ]
            )
        if method == "POST" and parts[0] == "channels" and parts[-1] == "typing":
            if self.typing_gate is not None:
                await self.typing_gate.wait()
            return web.Response(status=204)
        if method == "POST" and parts[0] == "channels" and parts[-1] == "messages":
            if self._message_faults:
                status, body, headers = self._message_faults.pop(0)
                return json_response(body, status=status, headers=headers)
            if _empty_message(req.json or {}, req.files):
                return _empty_message_error()
            sent = self._store_sent(int(parts[1]), req.json or {})
            if self.echo_sent:
                guild = self._guild_of_channel(int(parts[1]))
                await self.dispatch("MESSAGE_CREATE", sent, guild_id=guild.id if guild else None)
            return json_response(sent)
        if method == "PATCH" and parts[0] == "channels" and parts[2:3] == ["messages"]:
            return self._edit_message(int(parts[1]), int(parts[3]), req.json or {})
        if method == "POST" and parts[0] == "interactions" and parts[-1] == "callback":
            return self._callback(parts[1], parts[2], req)
        if parts[0] == "webhooks" and len(parts) >= 3:
            return self._interaction_webhook(method, parts, req)
        return json_response(
            {"message": f"fake Discord: no route {method} {path}", "code": 0}, status=404
        )

    def _callback(self, interaction_id: str, token: str, req: RecordedRequest) -> web.Response:
        """An interaction response: within the deadline, once, of a type that fits."""
        interaction = self.interactions.get(token)
        late = interaction is not None and (
            time.monotonic() - interaction.created > self.response_deadline
        )
        if interaction is None or str(interaction.id) != interaction_id or late:
            return json_response({"message": "Unknown interaction", "code": 10062}, status=404)
        if interaction.responded:
            return json_response(
                {"message": "Interaction has already been acknowledged.", "code": 40060},
                status=400,
            )
        body = req.json or {}
        kind = body.get("type")
        if kind not in _CALLBACK_TYPES[interaction.type]:
            return json_response(
                {"message": "Invalid interaction response type", "code": 50035}, status=400
            )
        data = body.get("data") or {}
        if kind == 4 and _empty_message(data, req.files):
            return _empty_message_error()
        if kind == 7 and interaction.message is not None:
            if _empty_message({**interaction.message, **data}, req.files):
                return _empty_message_error()
        interaction.responded = True
        if kind in (4, 5):
            flags = int(data.get("flags") or 0) | (128 if kind == 5 else 0)  # 128: loading
            message = self._webhook_message({**data, "flags": flags})
            message["channel_id"] = str(interaction.channel_id)
            self.interaction_messages[int(message["id"])] = message
            interaction.message = message
        elif kind == 7 and interaction.message is not None:
            self._update(interaction.message, data)
        if req.query.get("with_response") in ("1", "true", "True"):
            return json_response(
                {
                    "interaction": {
                        "id": interaction_id,
                        "type": interaction.type,
                        "response_message_loading": kind == 5,
                        "response_message_ephemeral": bool(int(data.get("flags", 0)) & 64),
                    }
                }
            )
        return web.Response(status=204)

    def _interaction_webhook(
        self, method: str, parts: list[str], req: RecordedRequest
    ) -> web.Response:
        """/webhooks/{application}/{token}[/messages/@original]: only for an
        interaction already answered, while its token lives."""
        interaction = self.interactions.get(parts[2])
        expired = interaction is not None and (
            time.monotonic() - interaction.created > self.token_lifetime
        )
        if interaction is None or expired or not interaction.responded:
            return json_response({"message": "Unknown Webhook", "code": 10015}, status=404)
        original = parts[3:] == ["messages", "@original"]
        if original and interaction.message is None:
            return json_response({"message": "Unknown Message", "code": 10008}, status=404)
        if original and method == "DELETE":
            assert interaction.message is not None
            self.interaction_messages.pop(int(interaction.message["id"]), None)
            interaction.message = None
            return web.Response(status=204)
        if original and method in ("PATCH", "GET"):
            assert interaction.message is not None
            if method == "PATCH":
                if _empty_message({**interaction.message, **(req.json or {})}, req.files):
                    return _empty_message_error()
                self._update(interaction.message, req.json or {})
            return json_response(interaction.message)
        if method == "POST" and len(parts) == 3:  # a follow-up message
            if _empty_message(req.json or {}, req.files):
                return _empty_message_error()
            message = self._webhook_message(req.json or {})
            message["channel_id"] = str(interaction.channel_id)
            self.interaction_messages[int(message["id"])] = message
            return json_response(message)
        return json_response({"message": "405: Method Not Allowed", "code": 0}, status=405)

    @staticmethod
    def _update(message: JSONDict, body: JSONDict) -> None:
        """An edit of an interaction message: the fields sent replace the old ones;
        the loading state ends."""
        for key in ("content", "components", "embeds"):
            if key in body:
                message[key] = body[key] if body[key] is not None else []
        message["flags"] = int(message.get("flags") or 0) & ~128
        message["edited_timestamp"] = _now_iso()

    def _edit_message(self, channel_id: int, message_id: int, body: JSONDict) -> web.Response:
        """PATCH a message: Discord's per-channel edit limit, then its checks."""
        now = time.monotonic()
        window = [t for t in self._edit_buckets.get(channel_id, []) if now - t < self.edit_window]
        self._edit_buckets[channel_id] = window
        reset_after = (window[0] + self.edit_window - now) if window else self.edit_window
        bucket = {
            "X-RateLimit-Limit": str(self.edit_limit),
            "X-RateLimit-Bucket": f"edit-{channel_id}",
            "X-RateLimit-Reset-After": f"{reset_after:.3f}",
            "X-RateLimit-Reset": f"{time.time() + reset_after:.3f}",
        }
        if len(window) >= self.edit_limit:
            self.rate_limited_edits += 1
            headers = {
                **bucket,
                "X-RateLimit-Remaining": "0",
                "X-RateLimit-Scope": "user",
                "Retry-After": str(math.ceil(reset_after)),
                "Via": "1.1 google",
            }
            body_429 = {
                "message": "You are being rate limited.",
                "retry_after": round(reset_after, 3),
                "global": False,
            }
            return json_response(body_429, status=429, headers=headers)
        window.append(now)
        headers = {**bucket, "X-RateLimit-Remaining": str(self.edit_limit - len(window))}
        stored = self.messages.get(message_id)
        if stored is None or stored.get("channel_id") != str(channel_id):
            return json_response(
                {"message": "Unknown Message", "code": 10008}, status=404, headers=headers
            )
        if stored["author"]["id"] != str(self.bot.id):
            return json_response(
                {"message": "Cannot edit a message authored by another user", "code": 50005},
                status=403,
                headers=headers,
            )
        content = body.get("content")
        if _empty_message({**stored, **body}, []):
            return _empty_message_error(headers)
        if isinstance(content, str) and len(content) > 2000:
            return json_response(
                {
                    "message": "Invalid Form Body",
                    "code": 50035,
                    "errors": {
                        "content": {
                            "_errors": [
                                {
                                    "code": "BASE_TYPE_MAX_LENGTH",
                                    "message": "Must be 2000 or fewer in length.",
                                }
                            ]
                        }
                    },
                },
                status=400,
                headers=headers,
            )
        if isinstance(content, str):
            stored["content"] = content
            stored["edited_timestamp"] = _now_iso()
            self.edits.append((message_id, content))
            self.edit_times.append(now)
        return json_response(stored, headers=headers)

    def _store_sent(self, channel_id: int, body: JSONDict) -> JSONDict:
        content = body.get("content") or ""
        ref = body.get("message_reference")
        replied = self.messages.get(int(ref["message_id"])) if ref else None
        data = self.message_payload(
            channel_id=channel_id,
            author=self.bot,
            content=content,
            mentions=self._pinged(channel_id, content, body.get("allowed_mentions"), replied),
        )
        if ref:
            data["type"] = 19
            data["message_reference"] = {k: v for k, v in ref.items() if k != "fail_if_not_exists"}
            data["message_reference"].setdefault("channel_id", str(channel_id))
            if replied is not None:
                data["referenced_message"] = replied
        self.messages[int(data["id"])] = data
        return data

    def _pinged(
        self,
        channel_id: int,
        content: str,
        allowed: JSONDict | None,
        replied: JSONDict | None,
    ) -> list[FakeUser]:
        """Whom a sent message pings, as Discord decides it: its `mentions` lists only
        the users actually mentioned, not every <@id> in the text. Without
        `allowed_mentions` every user mention in the content pings, and so does a reply;
        with it, only the users it allows (`parse: ["users"]` or `users`) and the
        replied-to author only with `replied_user: true`."""
        guild = self._guild_of_channel(channel_id)
        known = {u.id: u for u in (guild.members if guild else [])}
        named = [int(i) for i in re.findall(r"<@!?(\d+)>", content)]
        if allowed is None:
            ids, reply_ping = named, True
        else:
            users = {int(i) for i in allowed.get("users") or []}
            parse_users = "users" in (allowed.get("parse") or [])
            ids = [i for i in named if parse_users or i in users]
            reply_ping = bool(allowed.get("replied_user"))
        if replied is not None and reply_ping:
            ids.append(int(replied["author"]["id"]))
        return [known[i] for i in dict.fromkeys(ids) if i in known]

    def _webhook_message(self, body: JSONDict) -> JSONDict:
        return {
            "id": str(self.snowflake()),
            "channel_id": "0",
            "author": self.bot.payload(),
            "content": body.get("content") or "",
            "timestamp": _now_iso(),
            "edited_timestamp": None,
            "tts": False,
            "mention_everyone": False,
            "mentions": [],
            "mention_roles": [],
            "attachments": [],
            "embeds": [],
            "pinned": False,
            "type": 20,
            "flags": int(body.get("flags") or 0),
            "components": list(body.get("components") or []),
            "webhook_id": str(self.application_id),
        }


def _empty_message(message: JSONDict, files: Sequence[tuple[str, bytes]]) -> bool:
    """What Discord refuses with 50006: a message with no text (spaces and newlines are
    no text) and no embed, file, attachment, sticker, component or poll."""
    text = message.get("content")
    if isinstance(text, str) and text.strip():
        return False
    others = ("embeds", "attachments", "sticker_ids", "components", "poll")
    return not files and not any(message.get(key) for key in others)


def _empty_message_error(headers: dict[str, str] | None = None) -> web.Response:
    body = {"message": "Cannot send an empty message", "code": 50006}
    return json_response(body, status=400, headers=headers)
