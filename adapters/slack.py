"""Slack adapter: one Bolt `AsyncApp`, one personality per Slack team.

Everything Slack-specific stays here: signature checks and OAuth are Bolt's, event
dedup and installations live in our storage (behind `SlackStore`), and what reaches
the runtime is only `IncomingMessage` / `CommandRequest`.

Design notes (the WHY):

* Community = the team the event happened in (``slack:T…``), never the token's team:
  an Enterprise Grid token serves many workspaces and each one is its own personality.
  A DM with the bot (SLACK_ALLOW_DMS) is the member's own private personality,
  ``slack:T…:dm:U…``, as on Discord: what someone tells the bot in private never
  reaches what it says in the workspace's channels. A `/sonality` typed in that DM is
  about that personality, where nobody moderates unless SONALITY_DM_MODERATION says so.
* Dedup runs before authorization and before any listener, keyed on ``event_id`` only.
  Slack redelivers on slow acks, and Socket Mode marks even first deliveries with a
  retry header, so only the id is trustworthy. Storage keeps the ids across restarts.
* Events are acked by Bolt before our listener runs (``process_before_response=False``);
  the slash command acks explicitly and does its work in a lazy listener, answering
  through ``response_url`` so a slow LLM never hits Slack's 3-second limit.
* Command output is ephemeral by default (only the caller sees it) so `/sonality`
  doesn't flood channels; a successful rollback is announced in the channel because it
  changes the personality for everyone there, and a command's picture (the timeline) is
  uploaded to the channel, because Slack has no ephemeral files.
* Every Slack Web API failure is logged with team and channel and swallowed: one bad
  channel or a missing scope must not take the adapter down for every workspace.
* Slack's agent surface (suggested prompts in the DM, feedback buttons under streamed
  replies, Confirm / Cancel under forget-me's question) is built in `slack_agent`, and
  shown only where the app has the `assistant:write` scope of the current manifest.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import secrets
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Protocol

from aiohttp import web
from slack_bolt.adapter.aiohttp import to_aiohttp_response, to_bolt_request
from slack_bolt.adapter.socket_mode.async_handler import AsyncSocketModeHandler
from slack_bolt.app.async_app import AsyncApp
from slack_bolt.context.ack.async_ack import AsyncAck
from slack_bolt.context.async_context import AsyncBoltContext
from slack_bolt.context.respond.async_respond import AsyncRespond
from slack_bolt.context.set_suggested_prompts.async_set_suggested_prompts import (
    AsyncSetSuggestedPrompts,
)
from slack_bolt.listener.async_builtins import AsyncTokenRevocationListeners
from slack_bolt.middleware.async_middleware import AsyncMiddleware
from slack_bolt.oauth.async_oauth_settings import AsyncOAuthSettings
from slack_bolt.request.async_request import AsyncBoltRequest
from slack_bolt.response import BoltResponse
from slack_sdk.errors import SlackApiError
from slack_sdk.http_retry.builtin_async_handlers import AsyncRateLimitErrorRetryHandler
from slack_sdk.oauth.installation_store.async_installation_store import AsyncInstallationStore
from slack_sdk.oauth.installation_store.models.bot import Bot
from slack_sdk.oauth.installation_store.models.installation import Installation
from slack_sdk.oauth.state_store.async_state_store import AsyncOAuthStateStore
from slack_sdk.web.async_client import AsyncWebClient

from adapters.chunking import split_message
from adapters.confirm_text import CANCELLED, NOT_YOURS, WORKING, expired_text
from adapters.sanitize import clean_command, clean_name, clean_text
from adapters.slack_agent import (
    CANCEL_ACTION,
    CONFIRM_ACTION,
    FEEDBACK_ACTION,
    NEGATIVE,
    POSITIVE,
    PROMPTS_TITLE,
    SUGGESTED_PROMPTS,
    Question,
    feedback_blocks,
    has_agent_surface,
    question_blocks,
)
from adapters.slack_settings import check_slack_settings
from bot.command_table import COMMAND_NAMES, PRIVATE_COMMANDS, command, split_command
from bot.images import AttachedFile, ImageFetcher
from bot.interface import ChatRuntime, StartupError
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
from bot.ratelimit import RateLimiter, Verdict
from bot.settings import Settings
from sonality.store import utcnow

__all__ = [
    "BOT_SCOPES",
    "MESSAGE_LIMIT",
    "SlackAdapter",
    "SlackStore",
    "from_slack_text",
    "to_mrkdwn",
]

log = logging.getLogger(__name__)

PLATFORM = "slack"
EVENTS_PATH = "/slack/events"
INSTALL_PATH = "/slack/install"
REDIRECT_PATH = "/slack/oauth_redirect"
# Slack renders up to 40k chars but recommends <= 4,000 per message; 3,500 leaves room
# for the mrkdwn conversion growing a chunk (escapes) and for the fence re-openings.
MESSAGE_LIMIT = 3500
# Slack retries a failed delivery three times within ~5 minutes; a day covers that and
# any restart in between at the cost of one small row per event.
EVENT_DEDUP_TTL_SECONDS = 24 * 3600
OAUTH_STATE_TTL_SECONDS = 600
WORKING_REACTION = "thinking_face"
# The longest an answer waits for its 🤔 reaction to be added first.
REACTION_LEAD_SECONDS = 1.0
# users.info answers (names, admin flags) are reused this long: fresh enough for a
# demoted admin, cheap enough for a busy channel under Slack's rate limits.
USER_CACHE_SECONDS = 60.0
# The most mentions of one message looked up with users.info (any other mention is named
# only if its member is cached, else left as `@U…`): a message of made-up `<@U…>` must
# not spend the workspace's users.info limit, which the admin check of commands shares.
MAX_MENTION_LOOKUPS = 10
# ...and at most this many a minute per workspace, whatever the messages: the rest of
# users.info's limit stays for authors and the admin check, which a member posting many
# messages of made-up mentions would otherwise use up (moderators then refused).
MENTION_LOOKUPS_PER_MINUTE = 20
# Slack's answer for a member id it does not know (a made-up mention): cached as nameless.
_NO_SUCH_USER = frozenset({"user_not_found", "user_not_visible"})
# response_url accepts at most 5 posts; longer command output is cut with a note.
MAX_RESPONSE_POSTS = 5
# How long close() lets in-flight replies finish before cancelling them.
CLOSE_GRACE_SECONDS = 10.0
# Scopes requested by the OAuth install flow; keep in sync with slack/manifest.yml.
BOT_SCOPES: tuple[str, ...] = (
    "app_mentions:read",
    "chat:write",
    "assistant:write",
    "commands",
    "files:read",
    "files:write",
    "reactions:write",
    "users:read",
    "im:history",
    "im:read",
    "im:write",
    "channels:history",
    "groups:history",
)
# What a free channel needs: the messages of public and private channels the app is in.
FREE_CHANNEL_SCOPES: tuple[str, ...] = ("channels:history", "groups:history")
#: `/sonality channel free` in a workspace whose app lacks those scopes.
FREE_NEEDS_SCOPES = (
    "A free channel needs the channels:history and groups:history scopes and the "
    "message.channels and message.groups events, which this app was set up without: a "
    "workspace admin adds them from slack/manifest.yml and reinstalls the app. Nothing "
    "was changed."
)
#: Where a shared file's `url_private` points.
FILES_HOST = "https://files.slack.com"
# Commands whose successful result the whole channel should see (see module docstring).
PUBLIC_RESULTS: frozenset[str] = frozenset({"rollback"})
# Why a command's file could not be posted, in words for the caller (Slack error codes).
_UPLOAD_PROBLEMS: dict[str, str] = {
    "missing_scope": "this app lacks the files:write permission; a workspace admin "
    "needs to reinstall it",
    "not_in_channel": "I'm not a member of this channel; invite me with /invite",
    "channel_not_found": "I can't see this channel; invite me with /invite",
    "file_uploads_disabled": "file uploads are turned off in this workspace",
}
# Conversations whose every message the app receives (message.channels, message.groups),
# for free channels.
_CHANNEL_TYPES = frozenset({"channel", "group"})
# Message subtypes that are still a human talking to us; edits, deletions, joins... aren't.
_HUMAN_SUBTYPES: frozenset[str | None] = frozenset({None, "file_share", "thread_broadcast"})
# ...and another bot talking to us (an app's own messages have no subtype; legacy
# integrations post `bot_message`).
_BOT_SUBTYPES = _HUMAN_SUBTYPES | {"bot_message"}
_AUTH_ERRORS = frozenset(
    {"invalid_auth", "not_authed", "account_inactive", "token_revoked", "token_expired"}
)
#: What auth.test answers once the app was uninstalled or its bot token revoked (the
#: workspace or the bot user deleted): unlike a mistyped token, the bot was removed.
_REVOKED_ERRORS = frozenset({"token_revoked", "account_inactive"})


class SlackStore(Protocol):
    """What the adapter needs from storage (the lead plugs in `storage.Database`).

    Times are timezone-aware UTC datetimes. Installation rows are opaque JSON dicts
    (slack_sdk's `Installation.__dict__`); `find_installation` with ``user_id=None``
    returns the latest installation saved for that (enterprise, team).
    """

    async def mark_event_seen(
        self, platform: str, event_id: str, at: datetime, ttl_seconds: int
    ) -> bool:
        """True the first time `event_id` is seen within its TTL, False for a repeat."""
        ...

    async def save_installation(self, key: dict[str, Any], data: dict[str, Any]) -> object: ...

    async def find_installation(
        self,
        enterprise_id: str | None,
        team_id: str | None,
        user_id: str | None = None,
        is_enterprise_install: bool = False,
    ) -> dict[str, Any] | None: ...

    async def delete_installation(
        self, enterprise_id: str | None, team_id: str | None, user_id: str | None = None
    ) -> object: ...

    async def issue_oauth_state(self, state: str, expires_at: datetime) -> object: ...

    async def consume_oauth_state(self, state: str, now: datetime) -> bool:
        """True once for a state issued and not yet expired; False afterwards."""
        ...

    async def record_feedback(
        self,
        community_id: str,
        reply_id: str,
        member_id: str,
        positive: bool,
        at: datetime,
        *,
        replaces: str | None = None,
    ) -> bool:
        """A member's thumbs up / down on a reply (their latest press counts, also over
        one recorded under `replaces`); False when the bot keeps no data for that
        community."""
        ...


# --------------------------------------------------------------------------------------
# Text conversion


def _escape(text: str, *, keep_quotes: bool) -> str:
    """Slack treats &, < and > as control characters everywhere, code included."""
    text = text.replace("&", "&amp;").replace("<", "&lt;")
    if keep_quotes:
        # A leading "> " is Slack's block quote; any other ">" must be escaped.
        return re.sub(r"(?<!^)>|^>(?! )", "&gt;", text, flags=re.M)
    return text.replace(">", "&gt;")


_CODE_SPLIT = re.compile(r"(```.*?(?:```|\Z)|`[^`\n]+`)", re.S)
_FENCE_LANG = re.compile(r"^```[A-Za-z0-9_+#.\-]*[ \t]*\n")
_LINK = re.compile(r"\[([^\]\n]+)\]\(((?:https?://|mailto:)[^\s)]+)\)")
_AUTOLINK = re.compile(r"&lt;((?:https?://|mailto:)[^\s&]+)&gt;")
_HEADING = re.compile(r"^[ \t]*#{1,6}[ \t]+(.+?)[ \t]*#*[ \t]*$", re.M)
_RULE = re.compile(r"^[ \t]*([-*_])(?:[ \t]*\1){2,}[ \t]*$", re.M)
_BULLET = re.compile(r"^([ \t]*)[-*+][ \t]+", re.M)
_BOLD = re.compile(r"\*\*(?=\S)(.+?)(?<=\S)\*\*|__(?=\S)(.+?)(?<=\S)__")
_ITALIC = re.compile(r"(?<![*\w])\*(?=[^\s*])([^*\n]+?)(?<=[^\s*])\*(?![*\w])")
_STRIKE = re.compile(r"~~(?=\S)(.+?)(?<=\S)~~")
_B = "\x01"  # bold placeholder, so italics conversion can't touch converted bold


def _shown_link(m: re.Match[str]) -> str:
    """A markdown link with its address in sight: "text (<url>)". Slack shows a masked
    link (`<url|text>`) without any warning, and the text can be a member's words the
    model repeated ("[the moderators' notice](https://…)")."""
    label, url = m.group(1), m.group(2)
    return f"<{url}>" if label.strip() == url else f"{label} (<{url}>)"


def _prose_to_mrkdwn(text: str) -> str:
    text = _escape(text, keep_quotes=True)
    text = _RULE.sub("──────────", text)
    text = _HEADING.sub(lambda m: _B + m.group(1).replace("**", "") + _B, text)
    text = _BULLET.sub(r"\1• ", text)
    text = _LINK.sub(_shown_link, text)
    text = _AUTOLINK.sub(r"<\1>", text)
    text = _BOLD.sub(lambda m: _B + (m.group(1) or m.group(2)) + _B, text)
    text = _ITALIC.sub(r"_\1_", text)
    text = _STRIKE.sub(r"~\1~", text)
    return text.replace(_B, "*")


def to_mrkdwn(markdown: str) -> str:
    """Convert the engine's CommonMark-ish answer to Slack mrkdwn.

    Slack has its own dialect (*bold*, _italic_, <url|text>) and no headings; code is
    left as written (only the language tag after ``` goes, Slack would print it).
    """
    out: list[str] = []
    for i, part in enumerate(_CODE_SPLIT.split(markdown)):
        if i % 2:
            if part.startswith("```"):
                part = _FENCE_LANG.sub("```\n", part, count=1)
            out.append(_escape(part, keep_quotes=False))
        elif part:
            out.append(_prose_to_mrkdwn(part))
    return "".join(out)


_ANGLE = re.compile(r"<([^<>]*)>")
_USER_MENTION = re.compile(r"<@([UW][A-Z0-9]+)(?:\|[^>]*)?>")


def from_slack_text(text: str, bot_user_id: str | None, names: dict[str, str]) -> str:
    """Slack's wire format to what a person would read: the bot's own mention removed,
    other mentions as @name, links as "text (url)", entities unescaped."""

    def repl(m: re.Match[str]) -> str:
        inner = m.group(1)
        target, _, label = inner.partition("|")
        if target.startswith("@"):
            uid = target[1:]
            if uid == bot_user_id:
                return ""
            return "@" + (label or names.get(uid) or uid)
        if target.startswith("#"):
            return "#" + (label or target[1:])
        if target.startswith("!"):
            if label:
                return label
            keyword = target[1:].split("^", 1)[0]
            return "@" + keyword
        if label and label != target:
            return f"{label} ({target})"
        return target.removeprefix("mailto:")

    out = _ANGLE.sub(repl, text)
    out = out.replace("&lt;", "<").replace("&gt;", ">").replace("&amp;", "&")
    return re.sub(r"[ \t]{2,}", " ", out).strip()


def render_chunks(text: str, limit: int = MESSAGE_LIMIT) -> list[str]:
    """Split first (on the markdown, so a link is never cut inside its <url|text>),
    then convert; a chunk that escaping pushed over the limit is split once more."""
    chunks: list[str] = []
    for piece in split_message(text, limit):
        converted = to_mrkdwn(piece)
        if len(converted) <= limit:
            chunks.append(converted)
        else:
            chunks.extend(split_message(converted, limit))
    return chunks


# --------------------------------------------------------------------------------------
# Storage bridges for Bolt


class _InstallationStore(AsyncInstallationStore):
    """Bolt's installation store on top of `SlackStore`: multi-workspace tokens in SQLite."""

    def __init__(
        self, store: SlackStore, on_installed: Callable[[str], Awaitable[None]] | None = None
    ) -> None:
        self._store = store
        self._log = logging.getLogger(__name__ + ".installations")
        # Told the workspace (or org) id after each OAuth install: a reinstall cancels
        # the erasure that uninstalling scheduled.
        self._on_installed = on_installed

    @property
    def logger(self) -> logging.Logger:
        return self._log

    async def async_save(self, installation: Installation) -> None:
        is_org = bool(installation.is_enterprise_install)
        key = {
            "enterprise_id": installation.enterprise_id,
            "team_id": None if is_org else installation.team_id,
            "user_id": installation.user_id,
            "is_enterprise_install": is_org,
        }
        await self._store.save_installation(key, dict(installation.__dict__))
        team = (None if is_org else installation.team_id) or installation.enterprise_id
        if self._on_installed is not None and team:
            await self._on_installed(team)

    async def async_save_bot(self, bot: Bot) -> None:
        # Bots are always saved as part of their installation (async_save).
        return None

    async def async_find_installation(
        self,
        *,
        enterprise_id: str | None,
        team_id: str | None,
        user_id: str | None = None,
        is_enterprise_install: bool | None = False,
    ) -> Installation | None:
        is_org = bool(is_enterprise_install)
        data = await self._store.find_installation(
            enterprise_id, None if is_org else team_id, user_id, is_org
        )
        if data is None:
            return None
        try:
            return Installation(**data)
        except TypeError:
            self._log.exception("unreadable Slack installation (team=%s)", team_id)
            return None

    async def async_find_bot(
        self,
        *,
        enterprise_id: str | None,
        team_id: str | None,
        is_enterprise_install: bool | None = False,
    ) -> Bot | None:
        installation = await self.async_find_installation(
            enterprise_id=enterprise_id,
            team_id=team_id,
            is_enterprise_install=is_enterprise_install,
        )
        if installation is None or installation.bot_token is None:
            return None
        return installation.to_bot()

    async def async_delete_bot(self, *, enterprise_id: str | None, team_id: str | None) -> None:
        await self._store.delete_installation(enterprise_id, team_id, None)

    async def async_delete_installation(
        self, *, enterprise_id: str | None, team_id: str | None, user_id: str | None = None
    ) -> None:
        await self._store.delete_installation(enterprise_id, team_id, user_id)


class _OAuthStateStore(AsyncOAuthStateStore):
    """One-time OAuth `state` values in storage, so a restart mid-install still works."""

    def __init__(self, store: SlackStore, ttl_seconds: int = OAUTH_STATE_TTL_SECONDS) -> None:
        self._store = store
        self._ttl = ttl_seconds
        self._log = logging.getLogger(__name__ + ".oauth_state")

    @property
    def logger(self) -> logging.Logger:
        return self._log

    async def async_issue(self, *args: Any, **kwargs: Any) -> str:
        state = secrets.token_urlsafe(24)
        await self._store.issue_oauth_state(state, utcnow() + timedelta(seconds=self._ttl))
        return state

    async def async_consume(self, state: str) -> bool:
        if not state:
            return False
        return await self._store.consume_oauth_state(state, utcnow())


class _EventDedup(AsyncMiddleware):
    """Drop any Events API delivery whose event_id storage has seen (acked with 200).

    Runs as Bolt's before_authorize: after the signature check (so forged requests
    can't poison the table) and before anything costs an API call.
    """

    def __init__(self, store: SlackStore) -> None:
        self._store = store

    async def async_process(
        self,
        *,
        req: AsyncBoltRequest,
        resp: BoltResponse,
        next: Callable[[], Awaitable[BoltResponse]],
    ) -> BoltResponse:
        body = req.body if isinstance(req.body, dict) else {}
        event_id = body.get("event_id")
        if body.get("type") == "event_callback" and isinstance(event_id, str) and event_id:
            try:
                first = await self._store.mark_event_seen(
                    PLATFORM, event_id, utcnow(), EVENT_DEDUP_TTL_SECONDS
                )
            except Exception:
                # Storage trouble: better a rare duplicate reply than a lost message.
                log.exception("event dedup failed for %s; processing anyway", event_id)
                first = True
            if not first:
                log.info("duplicate Slack event %s dropped", event_id)
                return BoltResponse(status=200, body="")
        return await next()


# --------------------------------------------------------------------------------------
# The adapter


@dataclass
class _UserInfo:
    name: str
    is_admin: bool
    fetched_at: float


def _attached(file: dict[str, Any]) -> AttachedFile:
    """A shared file as the event describes it. A file Slack hides (over a free plan's
    limit, or shared from another organisation) has no private URL: its fetch fails."""
    size = file.get("size")
    return AttachedFile(
        name=str(file.get("name") or file.get("title") or ""),
        url=str(file.get("url_private_download") or file.get("url_private") or ""),
        size=size if isinstance(size, int) else None,
        media_type=file.get("mimetype") or None,
    )


def _message_id(channel: str, ts: str) -> str:
    """A Slack message's id, unique on Slack: its `ts` is unique only in its channel."""
    return f"{channel}/{ts}"


def _team_of(body: dict[str, Any], context: AsyncBoltContext) -> str | None:
    """The workspace a message or command belongs to, i.e. whose personality answers.

    The outer `team_id` is the workspace the delivery is for (for a command, the
    caller's). `context_team_id` is the workspace of the conversation in newer payloads.
    The event's `team` is the author's team, which can be another org in a shared
    channel. A button press (`block_actions`) names its workspace as `team.id`. Bolt's
    `context.team_id` comes from `authorizations`, so it is the token's team. A workspace
    id (T…) wins over an org id (E…) wherever that appears.
    """
    raw_event = body.get("event")
    event: dict[str, Any] = raw_event if isinstance(raw_event, dict) else {}
    raw_team = body.get("team")
    pressed_in = raw_team.get("id") if isinstance(raw_team, dict) else None
    candidates = [
        c
        for c in (
            body.get("team_id"),
            body.get("context_team_id"),
            pressed_in,
            event.get("team"),
            context.team_id,
            event.get("user_team"),
        )
        if isinstance(c, str) and c
    ]
    return next((c for c in candidates if c.startswith("T")), None) or next(iter(candidates), None)


def _agent_surface(context: AsyncBoltContext) -> bool:
    """Whether this workspace's app has the agent surface (`slack_agent`): Bolt reads
    the bot token's scopes from auth.test (one workspace) or the installation (OAuth)."""
    authorized = context.authorize_result
    return has_agent_surface(authorized.bot_scopes if authorized is not None else None)


def _free_refusal(context: AsyncBoltContext) -> str:
    """Why this workspace's app cannot have free channels ("" : it can, or its scopes
    are not known): an app made from a manifest without the channel history scopes
    receives no channel messages but mentions."""
    authorized = context.authorize_result
    scopes = authorized.bot_scopes if authorized is not None else None
    if scopes is None or all(s in scopes for s in FREE_CHANNEL_SCOPES):
        return ""
    return FREE_NEEDS_SCOPES


def _channel_name(raw: object) -> str:
    """A slash command's `channel_name`, unless it is Slack's placeholder for a private
    conversation."""
    name = str(raw or "")
    return "" if name in ("privategroup", "directmessage") else clean_name(name)


THINKING_STATUS = "is thinking…"
#: At most this often a streamed reply is appended to (Slack rate-limits appendStream).
APPEND_EVERY = 0.5


class SlackStream:
    """A reply streamed with Slack's own streaming API (chat.startStream, appendStream,
    stopStream), fed as the model writes.

    Why a task of its own: the model's stream never waits for Slack; `feed` appends
    and the task sends what is new at most every `APPEND_EVERY`. A workspace without
    the streaming methods (`unknown_method`) is remembered, and the reply then goes
    out as one chat.postMessage: `finish` hands back the reply to post. With `feedback`
    an answer ends with Slack's feedback buttons (`slack_agent.feedback_blocks`).
    """

    def __init__(
        self,
        adapter: SlackAdapter,
        client: AsyncWebClient,
        team: str,
        channel: str,
        thread_ts: str,
        user_id: str,
        *,
        feedback: bool = False,
    ) -> None:
        self.adapter, self.client = adapter, client
        self.team, self.channel, self.thread_ts, self.user_id = team, channel, thread_ts, user_id
        self.feedback = feedback
        self.text = ""
        self.sent = 0  # characters of `text` Slack has
        self.ts: str | None = None
        self.failed = False
        self._wake = asyncio.Event()
        self._busy = asyncio.Lock()  # held while a request is out (never cut half-way)
        self._task: asyncio.Task[None] | None = None

    async def feed(self, piece: str) -> None:
        self.text += piece
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="slack stream")
        self._wake.set()

    async def stop(self) -> None:
        if self._task is not None:
            async with self._busy:
                self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def finish(self, reply: Reply) -> Reply | None:
        """End the stream with the rest of the reply (or the cut-off note); returns the
        reply to post instead when nothing could be streamed."""
        await self.stop()
        if reply.kind is ReplyKind.ANSWER:
            final = reply.text
        else:
            final = self.text.rstrip() + "\n\n" + reply.text
        if self.ts is None or self.failed:
            if self.ts is not None:  # part of it is out: add the rest as a new message
                final = final[self.sent :] if final.startswith(self.text[: self.sent]) else final
            return Reply(text=final, kind=reply.kind, truncated=reply.truncated)
        shown = self.text[: self.sent].lstrip()
        rest = final[len(shown) :] if final.startswith(shown) else "\n\n" + final
        # Only a whole answer is worth rating (not one the model broke off).
        rate = self.feedback and reply.kind is ReplyKind.ANSWER
        stopped = await self.adapter._call(
            "chat.stopStream",
            self.team,
            self.channel,
            self.client.chat_stopStream(
                channel=self.channel,
                ts=self.ts,
                markdown_text=rest or None,
                blocks=feedback_blocks() if rate else None,
            ),
        )
        if stopped is None:
            return Reply(text=rest, kind=reply.kind) if rest.strip() else None
        return None

    async def _run(self) -> None:
        while not self.failed:
            self._wake.clear()
            async with self._busy:
                await self._send()
            await asyncio.sleep(APPEND_EVERY)
            await self._wake.wait()

    async def _send(self) -> None:
        new = self.text[self.sent :]
        if not new:
            return
        if self.ts is None:
            try:
                started = await self.client.chat_startStream(
                    channel=self.channel,
                    thread_ts=self.thread_ts,
                    recipient_team_id=self.team,
                    recipient_user_id=self.user_id,
                    markdown_text=new,
                )
            except Exception as e:
                self.failed = True
                error = _api_error(e) if isinstance(e, SlackApiError) else repr(e)
                if error == "unknown_method":
                    self.adapter.lacks_streaming(self.team)
                else:
                    log.warning(
                        "Slack chat.startStream failed (team=%s channel=%s): %s; "
                        "the reply is posted whole",
                        self.team,
                        self.channel,
                        error,
                    )
                return
            self.ts = str(started.get("ts"))
        else:
            appended = await self.adapter._call(
                "chat.appendStream",
                self.team,
                self.channel,
                self.client.chat_appendStream(channel=self.channel, ts=self.ts, markdown_text=new),
            )
            if appended is None:
                self.failed = True
                return
        self.sent += len(new)


class SlackAdapter:
    """The Slack side of `python -m app`: Socket Mode or HTTP, one or many workspaces.

    `host` / `port` override where the HTTP endpoints listen (port 0 = any free port,
    reported by `http_port`), which tests and containers need; production uses
    SLACK_PORT on all interfaces.
    """

    name = "slack"
    #: Seconds a Confirm / Cancel question can be answered (as on Discord).
    confirm_timeout: float = 300.0

    def __init__(
        self,
        runtime: ChatRuntime,
        settings: Settings,
        store: SlackStore,
        *,
        host: str = "0.0.0.0",
        port: int | None = None,
    ) -> None:
        self._runtime = runtime
        self._settings = settings
        self._store = store
        self._host = host
        self._port = settings.slack_port if port is None else port
        self._moderators = settings.slack_moderators
        self._answer_bots = settings.answer_bot_ids
        self._users: dict[tuple[str, str], _UserInfo] = {}
        # Each workspace's mention lookups of the last minute (`MENTION_LOOKUPS_PER_MINUTE`).
        self._mention_lookups = RateLimiter(MENTION_LOOKUPS_PER_MINUTE, 60.0)
        # (team, user) -> the channel of that user's DM with the bot (it never changes).
        self._bot_dms: dict[tuple[str, str], str] = {}
        # Teams whose workspace answered `unknown_method` to chat.startStream.
        self._without_streaming: set[str] = set()
        # Nonces of the Confirm / Cancel questions answered (each runs once).
        self._answered: set[str] = set()
        self._inflight: set[asyncio.Task[Any]] = set()
        self._ready = asyncio.Event()
        self._stopped = asyncio.Event()
        self._closed = False
        self._runner: web.AppRunner | None = None
        self._socket: AsyncSocketModeHandler | None = None
        self._bound_port: int | None = None
        # Shared files come from Slack's files host; with SLACK_API_URL set (a fake
        # Slack in the tests) also from that host, where the fake serves them.
        hosts = [FILES_HOST]
        if "slack_api_url" in settings.model_fields_set:
            hosts.append(settings.slack_api_url)
        self._images = ImageFetcher(hosts, enabled=settings.reads_images, platform="Slack")

        check_slack_settings(settings)
        self.socket_mode = settings.slack_app_token is not None
        self.multi_workspace = settings.slack_client_id is not None
        self.app = self._build_app()

    # -- configuration -------------------------------------------------------------------

    def _build_app(self) -> AsyncApp:
        s = self._settings
        base_url = s.slack_api_url if s.slack_api_url.endswith("/") else s.slack_api_url + "/"
        token = None
        oauth: AsyncOAuthSettings | None = None
        if self.multi_workspace:
            if s.slack_bot_token is not None:
                log.warning("SLACK_CLIENT_ID is set: ignoring SLACK_BOT_TOKEN, using OAuth")
            assert s.slack_client_id is not None and s.slack_client_secret is not None
            oauth = AsyncOAuthSettings(
                client_id=s.slack_client_id,
                client_secret=s.slack_client_secret.get_secret_value(),
                scopes=list(BOT_SCOPES),
                user_scopes=[],
                install_path=INSTALL_PATH,
                redirect_uri_path=REDIRECT_PATH,
                installation_store=_InstallationStore(self._store, self._reinstalled),
                installation_store_bot_only=True,
                state_store=_OAuthStateStore(self._store),
                state_expiration_seconds=OAUTH_STATE_TTL_SECONDS,
            )
        elif s.slack_bot_token is not None:
            token = s.slack_bot_token.get_secret_value()
        client = AsyncWebClient(token=token, base_url=base_url)
        # Bolt copies these into every per-request client: a burst of replies gets
        # throttled by Slack (429) and is retried after Retry-After instead of dropped.
        client.retry_handlers.append(AsyncRateLimitErrorRetryHandler(max_retry_count=2))
        secret = s.slack_signing_secret.get_secret_value() if s.slack_signing_secret else None
        app = AsyncApp(
            # Bolt names a logger after its app and resets that logger's level to the
            # root's on every request; named "sonality" it would reset the engine's
            # package logger, so it is named under this adapter instead.
            name=f"{__name__}.bolt",
            client=client,
            # Socket Mode skips signature checks; an unused secret keeps Bolt from
            # falling back to the process environment.
            signing_secret=secret or "unused-in-socket-mode",
            oauth_settings=oauth,
            before_authorize=_EventDedup(self._store),
            process_before_response=False,
        )
        app.event("app_mention")(self._on_app_mention)
        # Before the plain "message" listener: Bolt runs only the first that matches.
        app.event({"type": "message", "subtype": "message_deleted"})(self._on_message_deleted)
        app.event({"type": "message", "subtype": "message_changed"})(self._on_message_changed)
        app.event("message")(self._on_message)
        app.command("/sonality")(ack=self._ack_command, lazy=[self._run_command])
        # Our own listeners instead of Bolt's `enable_token_revocation_listeners()`: Bolt
        # runs only the first matching listener, and these do what Bolt's do (delete the
        # revoked installations) and then tell the runtime the bot is gone.
        self._revocation = (
            AsyncTokenRevocationListeners(oauth.installation_store) if oauth is not None else None
        )
        app.event("app_uninstalled")(self._on_app_uninstalled)
        app.event("tokens_revoked")(self._on_tokens_revoked)
        # The agent surface (`slack_agent`).
        app.event("app_home_opened")(self._on_home_opened)
        app.action(FEEDBACK_ACTION)(self._on_feedback)
        app.action(CONFIRM_ACTION)(self._on_answer)
        app.action(CANCEL_ACTION)(self._on_answer)
        return app

    # -- membership --------------------------------------------------------------------------

    async def _on_app_uninstalled(self, body: dict[str, Any], context: AsyncBoltContext) -> None:
        if self._revocation is not None:
            await self._revocation.handle_app_uninstalled_events(context)
        await self._removed(body, context, "the Slack app was uninstalled")

    async def _on_tokens_revoked(
        self, body: dict[str, Any], event: dict[str, Any], context: AsyncBoltContext
    ) -> None:
        if self._revocation is not None:
            await self._revocation.handle_tokens_revoked_events(event, context)
        # Only the bot token matters here: without it the bot cannot read or answer.
        # Revoked user tokens (`tokens.oauth`) leave the bot in place.
        if (event.get("tokens") or {}).get("bot"):
            await self._removed(body, context, "the Slack bot token was revoked")

    async def _removed(self, body: dict[str, Any], context: AsyncBoltContext, why: str) -> None:
        team = _team_of(body, context)
        if not team:
            log.warning("Slack %s without a team id: ignored", why)
            return
        workspace = f"{PLATFORM}:{team}"
        try:
            await self._runtime.community_removed(workspace, why)
            # Its members' DM personalities: the bot can no longer talk to them either.
            for community_id in await self._runtime.known_communities(PLATFORM):
                if community_id.startswith(dm_community_id(workspace, "")):
                    await self._runtime.community_removed(community_id, why)
        except Exception:
            log.exception("could not record that %s (team=%s)", why, team)

    async def _reinstalled(self, team: str, community_id: str | None = None) -> None:
        """The team's personality (or `community_id`, a DM of it) is in use again."""
        try:
            await self._runtime.community_added(community_id or f"{PLATFORM}:{team}")
        except Exception:
            log.exception("could not record the reinstall (team=%s)", team)

    @staticmethod
    def _dm_community(team: str, user_id: str, author: _UserInfo | None) -> Community:
        name = f"DM with {author.name}" if author is not None and author.name else "DM"
        return Community(id=dm_community_id(f"{PLATFORM}:{team}", user_id), name=name)

    async def _in_bot_dm(
        self, client: AsyncWebClient, team: str, user_id: str, channel: str | None
    ) -> bool:
        """Whether a slash command came from the caller's DM with the bot (a DM between
        two people is a `D…` channel too, and is about the workspace's personality)."""
        if not self._settings.slack_allow_dms or not (channel or "").startswith("D"):
            return False
        key = (team, user_id)
        if key not in self._bot_dms:
            if len(self._bot_dms) > 10_000:
                self._bot_dms.clear()
            opened = await self._call(
                "conversations.open", team, channel, client.conversations_open(users=user_id)
            )
            found = str(((opened or {}).get("channel") or {}).get("id") or "")
            if not found:
                return False
            self._bot_dms[key] = found
        return self._bot_dms[key] == channel

    # -- lifecycle -------------------------------------------------------------------------

    @property
    def http_port(self) -> int | None:
        """The port the HTTP endpoints listen on (None: not serving HTTP)."""
        return self._bound_port

    async def wait_ready(self) -> None:
        """Resolves once start() is connected/listening (tests and health checks)."""
        await self._ready.wait()

    async def start(self) -> None:
        try:
            await self._preflight()
            if not self.socket_mode:
                await self._serve_http(self.app.web_app(path=EVENTS_PATH, port=self._port))
            else:
                if self.multi_workspace:
                    await self._serve_http(self._oauth_only_web_app())
                await self._connect_socket()
        except BaseException:
            await self._teardown()
            raise
        if self._closed:  # close() ran while we were connecting
            await self._teardown()
            return
        log.info(
            "Slack adapter ready (%s, %s)",
            "socket mode" if self.socket_mode else f"HTTP on port {self._bound_port}",
            "multi-workspace OAuth" if self.multi_workspace else "single workspace",
        )
        self._ready.set()
        await self._stopped.wait()

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            await self._teardown()
            pending = {t for t in self._inflight if not t.done()}
            if pending:
                _, late = await asyncio.wait(pending, timeout=CLOSE_GRACE_SECONDS)
                for task in late:
                    task.cancel()
                if late:
                    await asyncio.wait(late, timeout=1.0)
        finally:
            self._stopped.set()

    async def _teardown(self) -> None:
        """Stop taking new work: socket first (no new envelopes), then the HTTP site."""
        socket, self._socket = self._socket, None
        if socket is not None:
            with contextlib.suppress(Exception):
                await socket.close_async()
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()

    async def _preflight(self) -> None:
        """Fail at start, with one clear line, when a token is plainly wrong."""
        if self.multi_workspace:
            return
        try:
            await self.app.client.auth_test()
        except SlackApiError as e:
            error = _api_error(e)
            if error in _REVOKED_ERRORS:
                await self._revoked_while_offline(error)
                raise StartupError(
                    f"Slack rejected SLACK_BOT_TOKEN ({error}): the app was uninstalled or its "
                    "token revoked; the workspace's data is deleted after "
                    "SONALITY_DELETE_AFTER_REMOVAL_DAYS unless the app is installed again"
                ) from e
            if error in _AUTH_ERRORS:
                raise StartupError(f"Slack rejected SLACK_BOT_TOKEN ({error})") from e
            log.warning("Slack auth.test failed at start (%s); will retry on first event", error)
        except Exception as e:
            log.warning("Slack auth.test failed at start (%r); will retry on first event", e)

    async def _revoked_while_offline(self, error: str) -> None:
        """The single workspace's bot token was revoked while the bot was not running
        (Slack does not resend app_uninstalled or tokens_revoked): the workspaces it
        keeps data for count as removed, so the erasure countdown starts. Its team
        cannot be asked any more; a single-workspace bot keeps data for that one team
        only. Never raises."""
        try:
            for community_id in await self._runtime.known_communities(PLATFORM):
                await self._runtime.community_removed(
                    community_id, f"bot token {error} at start (removed while offline)"
                )
        except Exception:
            log.exception("Slack: could not record the removal found at start")

    async def _serve_http(self, web_app: web.Application) -> None:
        runner = web.AppRunner(web_app, shutdown_timeout=0.1, access_log=None)
        await runner.setup()
        self._runner = runner
        site = web.TCPSite(runner, self._host, self._port)
        try:
            await site.start()
        except OSError as e:
            raise StartupError(f"Slack cannot listen on port {self._port}: {e}") from e
        address = runner.addresses[0]
        self._bound_port = int(address[1])

    def _oauth_only_web_app(self) -> web.Application:
        """Install + redirect pages for Socket Mode apps.

        Bolt's server would also expose POST /slack/events, which in Socket Mode has no
        real signing secret behind it, so only the two GET routes are served here.
        """
        flow = self.app.oauth_flow
        assert flow is not None

        async def install(request: web.Request) -> web.Response:
            return await to_aiohttp_response(
                await flow.handle_installation(await to_bolt_request(request))
            )

        async def redirect(request: web.Request) -> web.Response:
            return await to_aiohttp_response(
                await flow.handle_callback(await to_bolt_request(request))
            )

        web_app = web.Application()
        web_app.add_routes(
            [web.get(flow.install_path, install), web.get(flow.redirect_uri_path, redirect)]
        )
        return web_app

    async def _connect_socket(self) -> None:
        s = self._settings
        assert s.slack_app_token is not None
        app_token = s.slack_app_token.get_secret_value()
        # The SDK retries a failed apps.connections.open forever; asking once ourselves
        # turns a bad app token into a startup error, and the URL is then reused.
        try:
            opened = await self.app.client.apps_connections_open(app_token=app_token)
        except SlackApiError as e:
            error = _api_error(e)
            if error in _AUTH_ERRORS:
                raise StartupError(f"Slack rejected SLACK_APP_TOKEN ({error})") from e
            raise StartupError(f"Slack Socket Mode could not start: {error or e}") from e
        except Exception as e:
            raise StartupError(f"Slack Socket Mode could not reach Slack: {e!r}") from e
        handler = AsyncSocketModeHandler(self.app, app_token=app_token, web_client=self.app.client)
        self._socket = handler
        handler.client.wss_uri = opened["url"]
        await handler.connect_async()

    # -- helpers -------------------------------------------------------------------------------

    @contextlib.contextmanager
    def _tracked(self) -> Iterator[None]:
        """Register the running listener task so close() can let it finish."""
        task = asyncio.current_task()
        if task is not None:
            self._inflight.add(task)
        try:
            yield
        finally:
            if task is not None:
                self._inflight.discard(task)

    def lacks_streaming(self, team: str) -> None:
        """The workspace has no streaming API: post replies whole there from now on."""
        if team not in self._without_streaming:
            self._without_streaming.add(team)
            log.info("Slack team %s has no streaming API: replies are posted whole", team)

    async def _call(
        self,
        what: str,
        team: str | None,
        channel: str | None,
        call: Awaitable[Any],
        *,
        quiet: frozenset[str] = frozenset(),
    ) -> Any | None:
        """One Slack API call; failures are logged with their place and swallowed."""
        try:
            return await call
        except SlackApiError as e:
            error = _api_error(e)
            if error not in quiet:
                log.warning("Slack %s failed (team=%s channel=%s): %s", what, team, channel, error)
        except Exception as e:
            log.warning("Slack %s failed (team=%s channel=%s): %r", what, team, channel, e)
        return None

    async def _user(
        self, client: AsyncWebClient, team: str, user_id: str, *, ask: bool = True
    ) -> _UserInfo | None:
        """The member as users.info describes them, cached; without `ask`, only if cached.
        A member Slack does not know is cached too, nameless and no admin; a failed call
        (throttled, network) is not, and is asked again next time."""
        key = (team, user_id)
        cached = self._users.get(key)
        now = time.monotonic()
        if cached is not None and now - cached.fetched_at < USER_CACHE_SECONDS:
            return cached
        if not ask:
            return None

        async def users_info() -> Any:
            try:
                return await client.users_info(user=user_id)
            except SlackApiError as e:
                if _api_error(e) in _NO_SUCH_USER:
                    return {}
                raise

        resp = await self._call("users.info", team, None, users_info())
        if resp is None:
            return None
        user = resp.get("user") or {}
        profile = user.get("profile") or {}
        info = _UserInfo(
            name=clean_name(
                str(
                    profile.get("display_name")
                    or profile.get("real_name")
                    or user.get("real_name")
                    or user.get("name")
                    or ""
                )
            ),
            is_admin=bool(
                user.get("is_admin") or user.get("is_owner") or user.get("is_primary_owner")
            ),
            fetched_at=now,
        )
        if len(self._users) > 10_000:
            self._users.clear()
        self._users[key] = info
        return info

    # -- messages -------------------------------------------------------------------------------

    async def _on_app_mention(
        self, body: dict[str, Any], event: dict[str, Any], context: AsyncBoltContext
    ) -> None:
        if str(event.get("channel", "")).startswith("D"):
            return  # a DM: message.im covers it (and SLACK_ALLOW_DMS decides)
        with self._tracked():
            await self._handle_event(body, event, context, is_dm=False)

    async def _on_message(
        self, body: dict[str, Any], event: dict[str, Any], context: AsyncBoltContext
    ) -> None:
        kind = event.get("channel_type")
        if kind in _CHANNEL_TYPES:
            # message.channels / message.groups: every message of a channel the app is
            # in, for free channels (the runtime decides from the channel's mode). One
            # that mentions the bot arrives as app_mention too, and is answered there.
            if context.bot_user_id and f"<@{context.bot_user_id}" in str(event.get("text", "")):
                return
            with self._tracked():
                await self._handle_event(body, event, context, is_dm=False, addressed=False)
            return
        if kind != "im":
            return
        if not self._settings.slack_allow_dms:
            log.debug("DM ignored: SLACK_ALLOW_DMS is off")
            return
        with self._tracked():
            await self._handle_event(body, event, context, is_dm=True)

    async def _on_message_deleted(
        self, body: dict[str, Any], event: dict[str, Any], context: AsyncBoltContext
    ) -> None:
        """A message was deleted (Slack sends it where the app gets the channel's
        messages: DMs through message.im, channels through message.channels /
        message.groups): the runtime takes back what it kept of it. Slack does not say
        who deleted it (see bot/deletion.py)."""
        await self._deleted(body, event, context, event.get("deleted_ts"))

    async def _deleted(
        self,
        body: dict[str, Any],
        event: dict[str, Any],
        context: AsyncBoltContext,
        ts: Any,
    ) -> None:
        """The runtime takes back the message at `ts` of the event's channel (from
        `message_deleted`, or the `tombstone` that replaces a deleted thread parent).
        Taking back again a message already taken back changes nothing."""
        team = _team_of(body, context)
        channel = event.get("channel")
        if not team or not channel or not ts or not isinstance(ts, str):
            log.debug("Slack deletion without team/channel/ts ignored: %s", body.get("event_id"))
            return
        workspace = f"{PLATFORM}:{team}"
        community_id: str | None = workspace
        if event.get("channel_type") == "im":
            author = (event.get("previous_message") or {}).get("user")
            known = [u for (t, u), dm in self._bot_dms.items() if t == team and dm == channel]
            user = author or next(iter(known), None)
            community_id = dm_community_id(workspace, user) if user else None
        try:
            await self._runtime.message_deleted(PLATFORM, _message_id(channel, ts), community_id)
        except Exception:
            log.exception("could not take back a deleted Slack message (team=%s)", team)

    async def _on_message_changed(
        self, body: dict[str, Any], event: dict[str, Any], context: AsyncBoltContext
    ) -> None:
        """A message was edited: if the bot answered it and the words changed, the old
        words are taken back and the new ones answered as a new message, in the same
        thread (see bot/deletion.py). A DM is always for the bot; in a channel, the new
        text addresses it if it mentions it, and otherwise goes to the runtime as a
        message that did not (a free channel answers those too).

        A deleted message that has thread replies (every channel message the bot
        answered: it answers in the message's thread) is not `message_deleted`: Slack
        replaces it with a `tombstone` ("This message was deleted.", same ts) and sends
        `message_deleted` only once its last reply is gone. The tombstone is that
        deletion."""
        team = _team_of(body, context)
        channel = event.get("channel")
        edited = event.get("message")
        if not team or not channel or not isinstance(edited, dict) or not edited.get("ts"):
            return
        if edited.get("subtype") == "tombstone":
            await self._deleted(body, event, context, edited.get("ts"))
            return
        if self._is_from_bot(edited) or edited.get("subtype") not in _HUMAN_SUBTYPES:
            return
        is_dm = event.get("channel_type") == "im"
        if is_dm and not self._settings.slack_allow_dms:
            return
        raw = str(edited.get("text") or "")
        previous = event.get("previous_message")
        if isinstance(previous, dict) and previous.get("text") == edited.get("text"):
            # The same words as Slack holds them (an unfurl, a reaction's update): no
            # edit, whatever names their mentions would render to now.
            return
        addressed = is_dm or bool(context.bot_user_id and f"<@{context.bot_user_id}>" in raw)
        client = context.client
        assert client is not None
        text = await self._incoming_text(client, team, raw, context)
        try:
            anew = await self._runtime.message_edited(
                PLATFORM, _message_id(channel, str(edited["ts"])), text
            )
        except Exception:
            log.exception("could not take back an edited Slack message (team=%s)", team)
            return
        if anew:
            again = {**edited, "channel": channel, "channel_type": event.get("channel_type")}
            with self._tracked():
                await self._handle_event(body, again, context, is_dm=is_dm, addressed=addressed)

    @staticmethod
    def _is_from_bot(event: dict[str, Any]) -> bool:
        """Any bot, not only ourselves (Bolt's IgnoringSelfEvents already drops those):
        another bot is answered only if listed, and the runtime limits how often."""
        return bool(
            event.get("bot_id") or event.get("subtype") == "bot_message" or event.get("bot_profile")
        )

    def _answerable_bot(self, event: dict[str, Any], context: AsyncBoltContext) -> str | None:
        """The id under which another bot's message is answered, or None: never our
        own message, and only a bot the operator listed (SONALITY_ANSWER_BOTS) by any of
        its ids (user, bot or app id)."""
        profile = event.get("bot_profile") or {}
        ids = [
            event.get("user"),
            event.get("bot_id"),
            profile.get("id"),
            profile.get("app_id"),
            event.get("app_id"),
        ]
        # Bolt already drops the app's own events; this holds should that ever change.
        own = {context.bot_id, context.bot_user_id} - {None}
        if any(i in own for i in ids):
            return None
        return next((i for i in ids if isinstance(i, str) and i in self._answer_bots), None)

    async def _handle_event(
        self,
        body: dict[str, Any],
        event: dict[str, Any],
        context: AsyncBoltContext,
        *,
        is_dm: bool,
        addressed: bool = True,
    ) -> None:
        bot_id: str | None = None
        if self._is_from_bot(event):
            bot_id = None if is_dm else self._answerable_bot(event, context)
            if bot_id is None or event.get("subtype") not in _BOT_SUBTYPES:
                return
        elif event.get("subtype") not in _HUMAN_SUBTYPES:
            return
        team = _team_of(body, context)
        channel = event.get("channel")
        user_id = bot_id or event.get("user")
        ts = event.get("ts")
        if not team or not channel or not user_id or not ts:
            log.debug("Slack event without team/channel/user/ts ignored: %s", body.get("event_id"))
            return
        # Slack delivers a team's events only while the app is installed there, so one
        # arriving means a (single-workspace) reinstall if the team was marked removed.
        await self._reinstalled(team)
        client = context.client
        assert client is not None
        # Threads keep a conversation together; a DM is already a private conversation,
        # so there we only stay in a thread if the user started one.
        thread_ts: str | None = event.get("thread_ts") or (None if is_dm else ts)
        reaction = dict(channel=channel, timestamp=ts, name=WORKING_REACTION)
        adding: asyncio.Task[Any] | None = None

        async def on_start() -> None:
            # Only for a message the runtime will answer (never a free channel's message
            # past its pace, nor anything in an `off` channel), and not awaited: a
            # throttled reactions.add (429, retried after Retry-After) must not hold
            # the answer back.
            nonlocal adding
            adding = asyncio.create_task(
                self._call(
                    "reactions.add",
                    team,
                    channel,
                    client.reactions_add(**reaction),
                    quiet=frozenset({"already_reacted"}),
                )
            )

        try:
            text = await self._incoming_text(client, team, event.get("text") or "", context)
            if bot_id is None:
                author = await self._user(client, team, user_id)
                name = author.name if author else ""
            else:  # users.info knows no B… or A… id; the event names the bot
                author = None
                profile = event.get("bot_profile") or {}
                name = clean_name(str(profile.get("name") or event.get("username") or ""))
            community = Community(id=f"{PLATFORM}:{team}")
            if is_dm:
                self._bot_dms[(team, user_id)] = channel
                community = self._dm_community(team, user_id, author)
                await self._reinstalled(team, community.id)
            message = IncomingMessage(
                community=community,
                channel_id=channel,
                thread_id=thread_ts,
                message_id=_message_id(channel, ts),
                user=User(id=user_id, name=name, is_bot=bot_id is not None),
                text=text,
                addressed=addressed,
            )
            # Fetched once the runtime lets the message through, and not for one that
            # did not address the bot (a free channel's): no picture is downloaded for a
            # message the bot may well not answer.
            files = [_attached(f) for f in event.get("files") or [] if isinstance(f, dict)]
            # Private files: fetched with the bot token (files:read).
            auth = {"Authorization": f"Bearer {context.bot_token or client.token or ''}"}

            async def attach(message: IncomingMessage) -> IncomingMessage:
                return await self._images.attach(message, files, auth)

            stream: SlackStream | None = None
            # A bot's answer is posted whole with chat.postMessage, whose text is escaped
            # so that no mention in it can ping anyone (a streamed one is markdown).
            if thread_ts is not None and team not in self._without_streaming and not bot_id:
                stream = SlackStream(
                    self,
                    client,
                    team,
                    channel,
                    thread_ts,
                    user_id,
                    feedback=_agent_surface(context),
                )
                if is_dm:  # an assistant thread: Slack shows the status under it
                    await self._call(
                        "assistant.threads.setStatus",
                        team,
                        channel,
                        client.assistant_threads_setStatus(
                            channel_id=channel, thread_ts=thread_ts, status=THINKING_STATUS
                        ),
                        quiet=frozenset(
                            {"unknown_method", "missing_scope", "not_allowed_token_type"}
                        ),
                    )
            try:
                reply = await self._runtime.handle(
                    message,
                    on_text=stream.feed if stream is not None else None,
                    on_start=on_start,
                    attach=attach if files and addressed else None,
                )
            except Exception:
                log.exception(
                    "runtime failed on a Slack message (team=%s channel=%s)", team, channel
                )
                # Nobody asked for an answer to a message that did not address the bot.
                reply = Reply(text=INTERNAL_ERROR, kind=ReplyKind.NOTICE) if addressed else None
            if adding is not None and reply is not None:
                # An answer ready before its reaction went out (a notice, a fast model)
                # waits that long, so the 🤔 never lands after it; a throttled
                # reactions.add holds it back no longer than this.
                await asyncio.wait({adding}, timeout=REACTION_LEAD_SECONDS)
            if stream is not None and reply is not None and reply.streamed:
                reply = await stream.finish(reply)
            elif stream is not None:
                await stream.stop()
            if reply is not None:
                await self._post_reply(client, team, channel, thread_ts, reply)
        finally:
            if adding is not None:
                await adding  # removing first would leave the reaction behind
                await self._call(
                    "reactions.remove",
                    team,
                    channel,
                    client.reactions_remove(**reaction),
                    quiet=frozenset({"no_reaction"}),
                )

    async def _incoming_text(
        self, client: AsyncWebClient, team: str, raw: str, context: AsyncBoltContext
    ) -> str:
        names: dict[str, str] = {}
        mentioned = dict.fromkeys(m.group(1) for m in _USER_MENTION.finditer(raw))
        mentioned.pop(context.bot_user_id or "", None)
        for i, uid in enumerate(mentioned):
            info = await self._user(client, team, uid, ask=False)
            if (
                info is None
                and i < MAX_MENTION_LOOKUPS
                and self._mention_lookups.check(team, "mentions") is Verdict.ALLOW
            ):
                info = await self._user(client, team, uid)
            if info is not None and info.name:
                names[uid] = info.name
        return clean_text(from_slack_text(raw, context.bot_user_id, names))

    async def _post_reply(
        self,
        client: AsyncWebClient,
        team: str,
        channel: str,
        thread_ts: str | None,
        reply: Reply,
    ) -> None:
        for chunk in render_chunks(reply.text):
            posted = await self._call(
                "chat.postMessage",
                team,
                channel,
                client.chat_postMessage(
                    channel=channel,
                    thread_ts=thread_ts,
                    text=chunk,
                    mrkdwn=True,
                    unfurl_links=False,
                    unfurl_media=False,
                ),
            )
            if posted is None:
                return  # the rest would fail the same way, or arrive out of order

    # -- /sonality ---------------------------------------------------------------------------

    async def _ack_command(self, ack: AsyncAck) -> None:
        await ack()

    async def _run_command(
        self,
        body: dict[str, Any],
        context: AsyncBoltContext,
        respond: AsyncRespond,
    ) -> None:
        with self._tracked():
            team = _team_of(body, context)
            channel = body.get("channel_id")
            user_id = body.get("user_id")
            if not team or not user_id:
                log.warning("/sonality without team or user ignored")
                return
            # A mention in a command keeps the member's id (`@U2`), not their handle:
            # forget-user must name exactly one member.
            text = _USER_MENTION.sub(r"<@\1>", body.get("text") or "")
            name, args = split_command(clean_command(from_slack_text(text, None, {})))
            if command(name) is None:
                result = CommandResult(
                    text=f"Unknown command `{name}`. Try `/sonality help`. "
                    f"Commands: {', '.join(COMMAND_NAMES)}.",
                    ok=False,
                    private=True,
                )
            else:
                client = context.client
                assert client is not None
                request = await self._command_request(
                    client, team, user_id, channel, name, args, body.get("user_name")
                )
                request = request.model_copy(
                    update={
                        "channel_name": _channel_name(body.get("channel_name")),
                        "free_refusal": _free_refusal(context),
                    }
                )
                result = await self._run(request, team)
                if result.files and result.ok and not result.private:
                    unposted = await self._post_files(client, team, channel, result)
                    if unposted is None:
                        return
                    result = unposted
                elif result.files and result.ok and name in PRIVATE_COMMANDS:
                    result = await self._dm_files(client, team, str(user_id), result)
                if result.confirm_args and _agent_surface(context):
                    await self._ask(respond, team, channel, request, result)
                    return
            await self._respond(respond, team, channel, name, result)

    async def _command_request(
        self,
        client: AsyncWebClient,
        team: str,
        user_id: str,
        channel: str | None,
        name: str,
        args: tuple[str, ...],
        user_name: object = None,
    ) -> CommandRequest:
        """Who runs `name`, as a moderator or not, about which personality."""
        info = await self._user(client, team, user_id)
        # Workspace admins/owners moderate; SLACK_MODERATOR_IDS adds people.
        community = Community(id=f"{PLATFORM}:{team}")
        moderator = user_id in self._moderators or (info is not None and info.is_admin)
        if await self._in_bot_dm(client, team, user_id, channel):
            community = self._dm_community(team, user_id, info)
            moderator = self._settings.dm_moderation
        return CommandRequest(
            community=community,
            caller=User(
                id=user_id,
                name=(info.name if info else "") or clean_name(str(user_name or "")),
            ),
            is_moderator=moderator,
            name=name,
            args=args,
            channel_id=channel or None,
        )

    async def _run(self, request: CommandRequest, team: str) -> CommandResult:
        try:
            return await self._runtime.run_command(request)
        except Exception:
            log.exception("runtime failed on /sonality %s (team=%s)", request.name, team)
            return CommandResult(text=INTERNAL_ERROR, ok=False, private=True)

    async def _upload(
        self, client: AsyncWebClient, team: str, channel: str, result: CommandResult
    ) -> str:
        """Post a command's files in `channel` with its text as the comment, through
        Slack's upload v2 flow (files.getUploadURLExternal, the upload,
        files.completeUploadExternal): "" once posted, else in words why not."""
        uploads = [
            {
                "file": f.data,
                "filename": f.name,
                "title": result.title or f.name,
                "alt_txt": f.description[:1000] or None,
            }
            for f in result.files
        ]
        try:
            await client.files_upload_v2(
                file_uploads=uploads, channel=channel, initial_comment=to_mrkdwn(result.text)
            )
            return ""
        except SlackApiError as e:
            error = _api_error(e)
            log.warning("Slack file upload failed (team=%s channel=%s): %s", team, channel, error)
            return _UPLOAD_PROBLEMS.get(error, f"Slack answered {error or 'an error'}")
        except Exception as e:
            log.warning("Slack file upload failed (team=%s channel=%s): %r", team, channel, e)
            return "the upload did not go through"

    async def _post_files(
        self, client: AsyncWebClient, team: str, channel: str | None, result: CommandResult
    ) -> CommandResult | None:
        """Post a command's files in the channel it came from. None once posted; else
        the private answer to give instead: the text, and in words why there is no
        picture."""
        problem = "there is no channel to post it in"
        if channel and not (problem := await self._upload(client, team, channel, result)):
            return None
        note = f"(I could not post the picture: {problem}.)"
        return result.model_copy(update={"text": f"{result.text}\n\n{note}", "private": True})

    async def _dm_files(
        self, client: AsyncWebClient, team: str, user_id: str, result: CommandResult
    ) -> CommandResult:
        """Send a private command's files to the caller in a direct message (Slack has
        no ephemeral files). Returns the ephemeral answer to give: where the file went,
        or why it did not."""
        opened = await self._call(
            "conversations.open", team, None, client.conversations_open(users=user_id)
        )
        dm = str(((opened or {}).get("channel") or {}).get("id") or "")
        problem = await self._upload(client, team, dm, result) if dm else "no direct message"
        if problem:
            note = f"(I could not send you the file: {problem}. Please try again later.)"
        else:
            note = "I sent you the file in a direct message."
        return result.model_copy(
            update={"text": f"{result.text}\n\n{note}", "private": True, "files": ()}
        )

    async def _respond(
        self,
        respond: AsyncRespond,
        team: str,
        channel: str | None,
        name: str,
        result: CommandResult,
        *,
        replace: bool = False,
        posts: int = MAX_RESPONSE_POSTS,
    ) -> None:
        """Post `result` to the command's response_url, in at most `posts` parts (what
        is left of the url's five); with `replace` its first part takes the place of the
        message whose button was pressed."""
        public = result.ok and not result.private and name in PUBLIC_RESULTS
        text = f"**{result.title}**\n{result.text}" if result.title else result.text
        chunks = render_chunks(text) or ["(no output)"]
        if len(chunks) > posts:
            chunks = chunks[:posts]
            chunks[-1] += "\n_(output cut: too long for Slack)_"
        for i, chunk in enumerate(chunks):
            if not await self._answer(
                respond,
                team,
                channel,
                text=chunk,
                response_type="in_channel" if public else "ephemeral",
                replace_original=True if replace and i == 0 else None,
            ):
                return

    async def _answer(
        self, respond: AsyncRespond, team: str, channel: str | None, **message: Any
    ) -> bool:
        """One post to a response_url; False (and logged) when it did not go through."""
        sent = await self._call("response_url", team, channel, respond(**message))
        if sent is None:
            return False
        if sent.status_code >= 400:
            log.warning(
                "Slack response_url refused (team=%s channel=%s): %s %s",
                team,
                channel,
                sent.status_code,
                sent.body,
            )
            return False
        return True

    # -- the agent surface (`slack_agent`) -----------------------------------------------

    async def _on_home_opened(
        self,
        body: dict[str, Any],
        event: dict[str, Any],
        context: AsyncBoltContext,
        set_suggested_prompts: AsyncSetSuggestedPrompts | None = None,
    ) -> None:
        """A member opened the bot's Messages tab: offer them what to ask. Not in the
        Home tab (Bolt gives no `set_suggested_prompts` there), and not where DMs go
        unanswered (SLACK_ALLOW_DMS off) or the app lacks the agent surface."""
        if event.get("tab") != "messages" or set_suggested_prompts is None:
            return
        if not self._settings.slack_allow_dms or not _agent_surface(context):
            return
        with self._tracked():
            await self._call(
                "assistant.threads.setSuggestedPrompts",
                _team_of(body, context),
                event.get("channel"),
                set_suggested_prompts(list(SUGGESTED_PROMPTS), title=PROMPTS_TITLE),
            )

    async def _on_feedback(
        self, ack: AsyncAck, body: dict[str, Any], context: AsyncBoltContext
    ) -> None:
        """A press of the feedback buttons under a streamed reply: one vote per member
        and reply, counted for the personality that wrote it."""
        await ack()
        with self._tracked():
            team = _team_of(body, context)
            user_id = str((body.get("user") or {}).get("id") or "")
            container = body.get("container") or {}
            reply_id = str(
                container.get("message_ts") or (body.get("message") or {}).get("ts") or ""
            )
            channel = str(
                container.get("channel_id") or (body.get("channel") or {}).get("id") or ""
            )
            value = _pressed_action(body).get("value")
            if not (team and user_id and reply_id and channel) or value not in (POSITIVE, NEGATIVE):
                log.warning("Slack feedback press without team, user, reply or known value ignored")
                return
            # A reply in a D… channel is in the presser's own DM with the bot.
            workspace = f"{PLATFORM}:{team}"
            community = (
                dm_community_id(workspace, user_id) if channel.startswith("D") else workspace
            )
            try:
                # A ts names a message only within its channel: "channel:ts" keeps two
                # replies of one workspace that share a ts from sharing their votes.
                # Releases before it recorded the bare ts: a new press replaces that vote.
                recorded = await self._store.record_feedback(
                    community,
                    f"{channel}:{reply_id}",
                    user_id,
                    value == POSITIVE,
                    utcnow(),
                    replaces=reply_id,
                )
            except Exception:
                log.exception("could not record Slack feedback (team=%s channel=%s)", team, channel)
                return
            if recorded:
                log.info("Slack feedback (%s) on reply %s in %s", value, reply_id, community)
            else:
                log.info(
                    "Slack feedback on reply %s ignored: no data kept for %s", reply_id, community
                )

    async def _on_answer(
        self,
        ack: AsyncAck,
        body: dict[str, Any],
        context: AsyncBoltContext,
        respond: AsyncRespond,
    ) -> None:
        """Confirm or Cancel under a question. Confirm runs its command with the
        confirming arguments, as the member who asked, and shows the answer in the
        question's place; Cancel says nothing changed."""
        await ack()
        with self._tracked():
            pressed = await self._pressed(body, context, respond)
            if pressed is None:
                return
            question, team, channel = pressed
            cancelled = _pressed_action(body).get("action_id") == CANCEL_ACTION
            await self._answer(
                respond,
                team,
                channel,
                text=CANCELLED if cancelled else WORKING,
                response_type="ephemeral",
                replace_original=True,
            )
            if cancelled:
                return
            client = context.client
            assert client is not None
            request = await self._command_request(
                client, team, question.owner, channel, question.command, question.confirm_args
            )
            # The personality the member was asked about, whatever the settings say now.
            request = request.model_copy(update={"community": Community(id=question.community)})
            result = await self._run(request, team)
            # "Working on it…" took one of the press's response_url posts.
            await self._respond(
                respond,
                team,
                channel,
                question.command,
                result,
                replace=True,
                posts=MAX_RESPONSE_POSTS - 1,
            )

    async def _ask(
        self,
        respond: AsyncRespond,
        team: str,
        channel: str | None,
        request: CommandRequest,
        result: CommandResult,
    ) -> None:
        """A command's question with Confirm / Cancel under it, for the caller only."""
        question = Question.ask(
            request.caller.id, request.community.id, request.name, result.confirm_args
        )
        shown = result.button_text or result.text
        text = f"**{result.title}**\n{shown}" if result.title else shown
        await self._answer(
            respond,
            team,
            channel,
            text=to_mrkdwn(shown),
            blocks=question_blocks(to_mrkdwn(text), question),
            response_type="ephemeral",
        )

    async def _pressed(
        self, body: dict[str, Any], context: AsyncBoltContext, respond: AsyncRespond
    ) -> tuple[Question, str, str | None] | None:
        """The question a Confirm or Cancel press answers, with its team and channel,
        when this press may answer it: the member who asked, in time, the first press.
        Anything else changes nothing (another member is told so in private)."""
        team = _team_of(body, context)
        user_id = (body.get("user") or {}).get("id")
        channel = (body.get("channel") or {}).get("id") or (body.get("container") or {}).get(
            "channel_id"
        )
        question = Question.decode(_pressed_action(body).get("value"))
        if not team or not user_id or question is None:
            log.warning("Slack button press without team, user or a question of ours ignored")
            return None
        # What the bot wrote names this workspace's personality (or the asker's DM with
        # it) and a command; a value naming anything else was not written here.
        workspace = f"{PLATFORM}:{team}"
        if command(question.command) is None or question.community not in (
            workspace,
            dm_community_id(workspace, question.owner),
        ):
            log.warning(
                "Slack: a press of a /sonality %s question naming %s, not a question of "
                "this workspace (team %s), ignored",
                question.command,
                question.community,
                team,
            )
            return None
        if user_id != question.owner:
            log.info(
                "Slack: %s pressed a button of another member's /sonality %s (team %s)",
                user_id,
                question.command,
                team,
            )
            await self._answer(
                respond,
                team,
                channel,
                text=NOT_YOURS,
                response_type="ephemeral",
                replace_original=False,
            )
            return None
        if question.nonce in self._answered:
            log.info("Slack: a second press of one /sonality %s question ignored", question.command)
            return None
        if len(self._answered) > 10_000:
            self._answered.clear()
        self._answered.add(question.nonce)
        if question.expired(self.confirm_timeout):
            await self._answer(
                respond,
                team,
                channel,
                text=expired_text(question.command),
                response_type="ephemeral",
                replace_original=True,
            )
            return None
        return question, team, channel


def _api_error(e: SlackApiError) -> str:
    """The error code Slack answered with ("" when there was no answer to read)."""
    return str(e.response.get("error", "")) if e.response is not None else ""


def _pressed_action(body: dict[str, Any]) -> dict[str, Any]:
    """The first (and with our blocks, only) action of a `block_actions` payload."""
    actions = body.get("actions")
    first = actions[0] if isinstance(actions, list) and actions else None
    return first if isinstance(first, dict) else {}
