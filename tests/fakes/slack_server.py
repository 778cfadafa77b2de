"""A fake Slack on 127.0.0.1: Web API, Socket Mode websocket, response_url, signer.

Bolt and slack_sdk are never mocked: they are pointed at this server (SLACK_API_URL,
the ws URL from apps.connections.open, response_url in payloads) and speak their real
wire protocol to it. Every request is recorded so tests assert on what Slack would
have received; waits poll a condition with a deadline instead of sleeping.

Shared files (`share_file()`) are served where a file object's `url_private` points, on
this server's host as on Slack's files host: only to `Authorization: Bearer <token>` of
a token of the file's workspace with `files:read`. Anything else is answered as Slack
answers it, with a redirect to the workspace's sign-in page (an HTML page, status 200,
if followed). Every such request is in `file_requests`.

chat.postMessage checks what Slack checks: blocks against Block Kit's rules
(`block_errors`: `invalid_blocks`, with Slack's json-pointer messages), and a message
with no text, blocks or attachments is `no_text`.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import itertools
import json
import re
import time
import urllib.parse
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from aiohttp import web

__all__ = [
    "FakeSlack",
    "FakeUpload",
    "RecordedRequest",
    "block_errors",
    "event_envelope",
    "interaction_form",
    "post_signed",
    "sign",
]

#: What a bot token may do unless a test says otherwise (a current install of our app).
DEFAULT_SCOPES: tuple[str, ...] = (
    "app_mentions:read",
    "assistant:write",
    "chat:write",
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
#: What an app created from the manifest before Slack's agent surface, members' images
#: and free channels (issue 25) holds: no `assistant:write`, no `files:read` and no
#: channel history (and no interactivity, which Slack does not report to the bot).
OLD_MANIFEST_SCOPES: tuple[str, ...] = tuple(
    s
    for s in DEFAULT_SCOPES
    if s not in ("assistant:write", "files:read", "channels:history", "groups:history")
)
#: Slack's limit on an image description (files.getUploadURLExternal `alt_txt`).
MAX_ALT_TXT = 1000
#: assistant.threads.setSuggestedPrompts takes up to this many prompts.
MAX_PROMPTS = 4
#: A response_url takes at most this many posts (within 30 minutes); later ones are
#: refused with 404 `used_url`.
MAX_RESPONSE_POSTS = 5
_CHANNEL_ID = re.compile(r"[CGD][A-Z0-9]{2,}")


@dataclass
class RecordedRequest:
    path: str
    args: dict[str, Any]  # query + form + JSON body merged (what the API method got)
    token: str | None  # bearer token (or `token` argument)

    @property
    def api_method(self) -> str | None:
        return self.path.removeprefix("/api/") if self.path.startswith("/api/") else None


@dataclass
class Identity:
    """What auth.test says about a token."""

    team_id: str = "T0001"
    user_id: str = "UBOT"  # the bot user
    bot_id: str = "BBOT"
    enterprise_id: str | None = None
    team: str = "Test Team"
    scopes: tuple[str, ...] = DEFAULT_SCOPES


@dataclass
class FakeUser:
    id: str
    name: str = ""
    is_admin: bool = False
    is_owner: bool = False
    is_primary_owner: bool = False
    is_bot: bool = False


@dataclass
class OAuthGrant:
    """What oauth.v2.access answers for a code."""

    team_id: str
    bot_token: str
    bot_user_id: str = "UBOT"
    enterprise_id: str | None = None
    installer_id: str = "UINSTALLER"
    scopes: tuple[str, ...] = DEFAULT_SCOPES  # what the install granted


@dataclass
class FakeUpload:
    """One file of the upload v2 flow, from files.getUploadURLExternal on."""

    file_id: str
    key: str  # the last part of its upload URL
    team_id: str
    filename: str
    length: int
    alt_txt: str | None = None
    snippet_type: str | None = None
    data: bytes | None = None  # set by the upload POST
    content_type: str = ""  # of that POST (raw bytes or multipart)
    completed: bool = False  # set by files.completeUploadExternal
    title: str | None = None
    channels: tuple[str, ...] = ()
    initial_comment: str | None = None
    thread_ts: str | None = None


@dataclass
class SharedFile:
    """A file members shared: the bytes, and the Content-Type the files host serves."""

    team_id: str
    data: bytes
    served_type: str


@dataclass
class FakeSlack:
    host: str = "127.0.0.1"
    identities: dict[str, Identity] = field(default_factory=dict)  # token -> identity
    default_identity: Identity = field(default_factory=Identity)
    users: dict[str, FakeUser] = field(default_factory=dict)
    grants: dict[str, OAuthGrant] = field(default_factory=dict)  # oauth code -> grant
    # API method -> Slack error code to answer with ({"ok": false, "error": ...}).
    failures: dict[str, str] = field(default_factory=dict)
    app_token_prefix: str = "xapp-"
    # Channels the bot is not a member of: sharing a file there is `not_in_channel`.
    not_in_channels: set[str] = field(default_factory=set)
    # Whether the workspace has Slack's streaming API (chat.startStream / appendStream /
    # stopStream). Off, those methods answer `unknown_method`, so the bot must fall back
    # to one chat.postMessage.
    streaming: bool = False

    def __post_init__(self) -> None:
        self.requests: list[RecordedRequest] = []
        self.responses: dict[str, list[dict[str, Any]]] = {}
        # Posts a response_url refused: more than MAX_RESPONSE_POSTS to one.
        self.refused_responses: list[dict[str, Any]] = []
        self.acks: list[dict[str, Any]] = []
        self.reactions: set[tuple[str, str, str]] = set()
        self.uploads: dict[str, FakeUpload] = {}  # file id -> upload
        self.dms: dict[str, str] = {}  # user id(s) -> the DM channel conversations.open gave
        # ts -> one streamed message: channel, thread_ts, text so far, and whether stopped.
        self.streams: dict[str, dict[str, Any]] = {}
        # (channel, thread_ts, status) of every assistant.threads.setStatus.
        self.statuses: list[tuple[str, str, str]] = []
        # Suggested prompts shown: channel, title and prompts of each accepted call.
        self.suggested_prompts: list[dict[str, Any]] = []
        self.ws_connections = 0
        self.files: dict[str, SharedFile] = {}  # url_private path -> file
        self.file_requests: list[RecordedRequest] = []
        self._ws: web.WebSocketResponse | None = None
        self._changed = asyncio.Condition()
        self._runner: web.AppRunner | None = None
        self._ids = itertools.count(1)
        self.port = 0

    # -- lifecycle ---------------------------------------------------------------------

    async def start(self) -> FakeSlack:
        app = web.Application()
        app.router.add_route("*", "/api/{method}", self._api)
        app.router.add_get("/link", self._link)
        app.router.add_post("/response/{rid}", self._response)
        app.router.add_post("/upload/v1/{key}", self._upload)
        app.router.add_get("/files-pri/{key}/{tail:.+}", self._file)
        app.router.add_get("/", self._sign_in)
        self._runner = web.AppRunner(app, shutdown_timeout=0.1, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, 0)
        await site.start()
        self.port = int(self._runner.addresses[0][1])
        return self

    async def close(self) -> None:
        if self._ws is not None and not self._ws.closed:
            await self._ws.close()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def __aenter__(self) -> FakeSlack:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    @property
    def base_url(self) -> str:
        """Value for SLACK_API_URL (ends with "/" as slack_sdk requires)."""
        return f"http://{self.host}:{self.port}/api/"

    def response_url(self, rid: str) -> str:
        """Where `respond()` posts; answers are recorded under `rid` in `responses`."""
        return f"http://{self.host}:{self.port}/response/{rid}"

    # -- queries -------------------------------------------------------------------------

    def calls(self, api_method: str) -> list[RecordedRequest]:
        return [r for r in self.requests if r.api_method == api_method]

    def posts(self) -> list[dict[str, Any]]:
        return [r.args for r in self.calls("chat.postMessage")]

    def all_responses(self) -> list[dict[str, Any]]:
        return [body for bodies in self.responses.values() for body in bodies]

    def shared_files(self) -> list[FakeUpload]:
        """Uploads that files.completeUploadExternal shared, in the order they were made."""
        return [u for u in self.uploads.values() if u.completed]

    async def wait_for(
        self, predicate: Callable[[], Any], within: float = 5.0, what: str = "condition"
    ) -> Any:
        """Poll `predicate` after every recorded request until truthy, for `within` s."""
        deadline = time.monotonic() + within
        async with self._changed:
            while True:
                value = predicate()
                if value:
                    return value
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"timed out waiting for {what}")
                try:
                    await asyncio.wait_for(self._changed.wait(), timeout=min(left, 0.2))
                except TimeoutError:
                    pass

    async def settle(self, quiet: float = 0.3, within: float = 5.0) -> None:
        """Wait until no request has arrived for `quiet` seconds (to prove an absence)."""
        deadline = time.monotonic() + within
        seen = -1
        while time.monotonic() < deadline:
            count = len(self.requests) + len(self.acks) + len(self.all_responses())
            if count == seen:
                return
            seen = count
            await asyncio.sleep(quiet)
        raise AssertionError("traffic did not settle")

    async def _notify(self) -> None:
        async with self._changed:
            self._changed.notify_all()

    # -- shared files: url_private --------------------------------------------------------

    def share_file(
        self,
        name: str,
        data: bytes,
        *,
        mimetype: str = "image/png",
        served_type: str | None = None,
        size: int | None = None,
        team: str = "T0001",
    ) -> dict[str, Any]:
        """The file object an event carries for a file shared in `team`; the bytes are
        served at its `url_private` with `served_type` (default `mimetype`)."""
        file_id = f"F{next(self._ids):08d}"
        path = f"/files-pri/{team}-{file_id}/{name}"
        download = f"/files-pri/{team}-{file_id}/download/{name}"
        shared = SharedFile(team, data, served_type or mimetype)
        self.files[path] = self.files[download] = shared
        base = f"http://{self.host}:{self.port}"
        return {
            "id": file_id,
            "name": name,
            "title": name,
            "mimetype": mimetype,
            "filetype": name.rsplit(".", 1)[-1].lower(),
            "size": len(data) if size is None else size,
            "mode": "hosted",
            "is_external": False,
            "url_private": base + path,
            "url_private_download": base + download,
        }

    async def _file(self, request: web.Request) -> web.Response:
        auth = request.headers.get("Authorization", "")
        token = auth.removeprefix("Bearer ") if auth.startswith("Bearer ") else None
        self.file_requests.append(RecordedRequest(path=request.path, args={}, token=token))
        await self._notify()
        shared = self.files.get(request.path)
        ident = self._identity(token)
        if (
            shared is None
            or ident is None
            or "files:read" not in ident.scopes
            or ident.team_id != shared.team_id
        ):
            redirect = "/?redir=" + urllib.parse.quote(request.path, safe="")
            return web.Response(status=302, headers={"Location": redirect})
        return web.Response(body=shared.data, headers={"Content-Type": shared.served_type})

    async def _sign_in(self, request: web.Request) -> web.Response:
        self.file_requests.append(RecordedRequest(path=request.path_qs, args={}, token=None))
        await self._notify()
        return web.Response(
            text="<!DOCTYPE html><html><title>Sign in | Slack</title></html>",
            content_type="text/html",
        )

    # -- Socket Mode -----------------------------------------------------------------------

    async def push_envelope(
        self,
        type: str,
        payload: dict[str, Any],
        *,
        accepts_response_payload: bool = False,
        retry_attempt: int = 0,
    ) -> str:
        """Send one envelope over the connected websocket; returns its envelope_id."""
        await self.wait_for(lambda: self._ws is not None and not self._ws.closed, what="ws")
        assert self._ws is not None
        envelope_id = f"env-{next(self._ids)}"
        message: dict[str, Any] = {
            "envelope_id": envelope_id,
            "type": type,
            "accepts_response_payload": accepts_response_payload,
            "payload": payload,
        }
        if type == "events_api":
            message["retry_attempt"] = retry_attempt
            message["retry_reason"] = "timeout" if retry_attempt else ""
        await self._ws.send_str(json.dumps(message))
        return envelope_id

    async def wait_for_ack(self, envelope_id: str, within: float = 5.0) -> dict[str, Any]:
        def find() -> dict[str, Any] | None:
            return next((a for a in self.acks if a.get("envelope_id") == envelope_id), None)

        return await self.wait_for(find, within, what=f"ack of {envelope_id}")

    async def _link(self, request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse(autoping=True)
        await ws.prepare(request)
        self._ws = ws
        self.ws_connections += 1
        await ws.send_str(
            json.dumps(
                {
                    "type": "hello",
                    "num_connections": 1,
                    "debug_info": {"host": "fake", "approximate_connection_time": 3600},
                    "connection_info": {"app_id": "A0001"},
                }
            )
        )
        await self._notify()
        async for msg in ws:
            if msg.type == aiohttp.WSMsgType.TEXT:
                try:
                    data = json.loads(msg.data)
                except ValueError:
                    continue
                if isinstance(data, dict) and "envelope_id" in data:
                    self.acks.append(data)
                    await self._notify()
        return ws

    # -- response_url ---------------------------------------------------------------------------

    async def _response(self, request: web.Request) -> web.Response:
        raw = await request.read()
        body = json.loads(raw) if raw else {}
        if body.get("blocks") is not None and block_errors(body["blocks"]):
            return web.Response(status=400, text="invalid_blocks")
        posted = self.responses.setdefault(request.match_info["rid"], [])
        if len(posted) >= MAX_RESPONSE_POSTS:
            self.refused_responses.append(body)
            await self._notify()
            return web.Response(status=404, text="used_url")
        posted.append(body)
        await self._notify()
        return web.Response(text="ok")

    # -- interactions (what Slack sends when a member presses a button) -------------------

    def press_feedback(
        self, ts: str, *, user: str, team: str = "T0001", positive: bool = True
    ) -> dict[str, Any]:
        """The `block_actions` payload of `user` pressing thumbs up (or down) under the
        streamed message `ts`, built from the blocks the bot sent with it."""
        stream = self.streams[ts]
        assert stream["stopped"], "Slack shows a message's blocks once its stream stopped"
        for block in stream.get("blocks") or []:
            for element in block.get("elements") or []:
                if block["type"] == "context_actions" and element["type"] == "feedback_buttons":
                    button = element["positive_button" if positive else "negative_button"]
                    action = {
                        "type": "feedback_buttons",
                        "action_id": element["action_id"],
                        "block_id": block.get("block_id") or "fb",
                        "value": button["value"],
                    }
                    message = {
                        "type": "message",
                        "ts": ts,
                        "thread_ts": stream["thread_ts"],
                        "text": stream["text"],
                        "blocks": stream["blocks"],
                    }
                    return self._press(team, user, stream["channel"], ts, action, message=message)
        raise AssertionError(f"message {ts} has no feedback buttons")

    def press_button(
        self, rid: str, label: str, *, user: str, team: str = "T0001", channel: str = "C0001"
    ) -> dict[str, Any]:
        """The `block_actions` payload of `user` pressing the button labelled `label` on
        the latest message with blocks posted to response_url `rid` (an ephemeral
        message, seen only by the member it was for; Slack still names who pressed)."""
        message = next(b for b in reversed(self.responses[rid]) if b.get("blocks"))
        for block in message["blocks"]:
            for element in block.get("elements") or []:
                if element.get("type") == "button" and element["text"]["text"] == label:
                    action = {
                        "type": "button",
                        "action_id": element["action_id"],
                        "block_id": block.get("block_id") or "q",
                        "text": element["text"],
                        "value": element.get("value"),
                        **({"style": element["style"]} if "style" in element else {}),
                    }
                    return self._press(team, user, channel, f"{time.time():.6f}", action)
        raise AssertionError(f"no button {label!r} on the message posted to {rid}")

    def _press(
        self,
        team: str,
        user: str,
        channel: str,
        ts: str,
        action: dict[str, Any],
        *,
        message: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        rid = f"press{next(self._ids)}"
        payload: dict[str, Any] = {
            "type": "block_actions",
            "user": {"id": user, "username": user.lower(), "name": user.lower(), "team_id": team},
            "api_app_id": "A0001",
            "token": "legacy-verification-token",
            "container": {
                "type": "message",
                "message_ts": ts,
                "channel_id": channel,
                "is_ephemeral": message is None,
            },
            "trigger_id": f"{next(self._ids)}.{next(self._ids)}",
            "team": {"id": team, "domain": "test"},
            "enterprise": None,
            "is_enterprise_install": False,
            "channel": {"id": channel, "name": "general" if channel.startswith("C") else ""},
            "state": {"values": {}},
            "response_url": self.response_url(rid),
            "actions": [{**action, "action_ts": f"{time.time():.6f}"}],
        }
        if message is not None:
            payload["message"] = message
        return payload

    # -- Web API ----------------------------------------------------------------------------------

    async def _api(self, request: web.Request) -> web.Response:
        raw = await request.read()
        args: dict[str, Any] = dict(request.query)
        ctype = request.content_type
        if raw and ctype == "application/json":
            args.update(json.loads(raw))
        elif raw and ctype == "application/x-www-form-urlencoded":
            args.update(dict(urllib.parse.parse_qsl(raw.decode())))
        auth = request.headers.get("Authorization", "")
        token = auth.removeprefix("Bearer ") if auth.startswith("Bearer ") else None
        token = token or args.get("token")
        method = request.match_info["method"]
        self.requests.append(RecordedRequest(path=request.path, args=args, token=token))
        await self._notify()
        # Slack names the token's scopes on every answer (Bolt reads them from auth.test).
        ident = self._identity(token)
        headers = {"x-oauth-scopes": ",".join(ident.scopes)} if ident is not None else {}
        if method in self.failures:
            return web.json_response({"ok": False, "error": self.failures[method]}, headers=headers)
        handler = getattr(self, "_api_" + method.replace(".", "_"), None)
        if handler is None:
            return web.json_response({"ok": False, "error": "unknown_method"}, headers=headers)
        result: dict[str, Any] = await handler(args, token)
        return web.json_response(result, headers=headers)

    def sends_channel_messages(self, *, private: bool = False, token: str | None = None) -> bool:
        """Whether Slack sends the app `message` events of a channel it is in: only with
        the scope behind the subscription (message.channels needs `channels:history`,
        message.groups `groups:history`); without it the app gets mentions alone."""
        ident = self.identities.get(token or "", self.default_identity)
        return ("groups:history" if private else "channels:history") in ident.scopes

    def _identity(self, token: str | None) -> Identity | None:
        if not token:
            return None
        if token in self.identities:
            return self.identities[token]
        return self.default_identity if token.startswith("xoxb-") else None

    async def _api_auth_test(self, args: dict[str, Any], token: str | None) -> dict[str, Any]:
        ident = self._identity(token)
        if ident is None:
            return {"ok": False, "error": "invalid_auth"}
        return {
            "ok": True,
            "url": "https://fake.slack.com/",
            "team": ident.team,
            "user": "sonality",
            "team_id": ident.team_id,
            "user_id": ident.user_id,
            "bot_id": ident.bot_id,
            "enterprise_id": ident.enterprise_id,
            "is_enterprise_install": False,
        }

    async def _api_chat_postMessage(
        self, args: dict[str, Any], token: str | None
    ) -> dict[str, Any]:
        if self._identity(token) is None:
            return {"ok": False, "error": "invalid_auth"}
        blocks, invalid = _blocks_of(args)
        if invalid is not None:
            return invalid
        if not args.get("text") and not blocks and not args.get("attachments"):
            return {"ok": False, "error": "no_text"}  # Slack's answer to a message of nothing
        ts = f"{time.time():.6f}"
        return {
            "ok": True,
            "channel": args.get("channel"),
            "ts": ts,
            "message": {"text": args.get("text"), "ts": ts},
        }

    # -- streaming (chat.startStream / appendStream / stopStream) -------------------------

    def _stream_refusal(self, token: str | None) -> dict[str, Any] | None:
        if not self.streaming:
            return {"ok": False, "error": "unknown_method"}
        if self._identity(token) is None:
            return {"ok": False, "error": "not_authed" if not token else "invalid_auth"}
        return None

    def _streamed(self, args: dict[str, Any]) -> tuple[dict[str, Any] | None, dict[str, Any]]:
        """The stream `args` names (by channel and ts), or Slack's error for it."""
        if not args.get("channel") or not args.get("ts"):
            return None, self._invalid("missing required field: channel or ts")
        stream = self.streams.get(str(args["ts"]))
        if stream is None or stream["channel"] != args["channel"]:
            return None, {"ok": False, "error": "message_not_found"}
        if stream["stopped"]:
            return None, {"ok": False, "error": "message_not_in_streaming_state"}
        return stream, {"ok": True, "channel": args["channel"], "ts": args["ts"]}

    async def _api_chat_startStream(
        self, args: dict[str, Any], token: str | None
    ) -> dict[str, Any]:
        refused = self._stream_refusal(token)
        if refused is not None:
            return refused
        channel, thread_ts = args.get("channel"), args.get("thread_ts")
        if not channel or not thread_ts:
            return self._invalid("missing required field: channel or thread_ts")
        if not str(channel).startswith("D") and not (
            args.get("recipient_team_id") and args.get("recipient_user_id")
        ):
            # Outside a DM Slack must know whom the stream is for.
            return {"ok": False, "error": "missing_recipient_user_id"}
        ts = f"{time.time():.6f}"
        self.streams[ts] = {
            "channel": channel,
            "thread_ts": thread_ts,
            "text": str(args.get("markdown_text") or ""),
            "appends": 0,
            "stopped": False,
        }
        return {"ok": True, "channel": channel, "ts": ts}

    async def _api_chat_appendStream(
        self, args: dict[str, Any], token: str | None
    ) -> dict[str, Any]:
        refused = self._stream_refusal(token)
        if refused is not None:
            return refused
        if not args.get("markdown_text"):
            return self._invalid("missing required field: markdown_text")
        stream, answer = self._streamed(args)
        if stream is not None:
            stream["text"] += str(args["markdown_text"])
            stream["appends"] += 1
        return answer

    async def _api_chat_stopStream(self, args: dict[str, Any], token: str | None) -> dict[str, Any]:
        refused = self._stream_refusal(token)
        if refused is not None:
            return refused
        blocks, invalid = _blocks_of(args)
        if invalid is not None:
            return invalid
        stream, answer = self._streamed(args)
        if stream is not None:
            stream["text"] += str(args.get("markdown_text") or "")
            stream["stopped"] = True
            stream["blocks"] = blocks or []  # rendered at the bottom of the message
            answer["message"] = {"text": stream["text"], "ts": args["ts"], "blocks": blocks or []}
        return answer

    async def _api_assistant_threads_setStatus(
        self, args: dict[str, Any], token: str | None
    ) -> dict[str, Any]:
        if self._identity(token) is None:
            return {"ok": False, "error": "not_authed" if not token else "invalid_auth"}
        channel, thread_ts = args.get("channel_id"), args.get("thread_ts")
        if not channel or not thread_ts or "status" not in args:
            return self._invalid("missing required field: channel_id, thread_ts or status")
        self.statuses.append((str(channel), str(thread_ts), str(args["status"])))
        return {"ok": True}

    async def _api_assistant_threads_setSuggestedPrompts(
        self, args: dict[str, Any], token: str | None
    ) -> dict[str, Any]:
        """Prompts offered in a member's DM with the app. For an agent-view app (the
        current manifest) a call naming a `thread_ts` is accepted and silently does
        nothing, as Slack documents; prompts are set on the DM itself."""
        ident, refused = self._with_scope(token, "assistant:write")
        if ident is None:
            return refused or {}
        channel, prompts = args.get("channel_id"), args.get("prompts")
        if not channel or prompts in (None, ""):
            return self._invalid("missing required field: channel_id or prompts")
        if str(channel) not in self.dms.values():
            return {"ok": False, "error": "channel_not_found"}
        try:
            items = json.loads(prompts) if isinstance(prompts, str) else prompts
        except ValueError:
            return self._invalid("invalid type for field: prompts")
        if (
            not isinstance(items, list)
            or not 1 <= len(items) <= MAX_PROMPTS
            or not all(
                isinstance(p, dict)
                and isinstance(p.get("title"), str)
                and p["title"].strip()
                and isinstance(p.get("message"), str)
                and p["message"].strip()
                for p in items
            )
        ):
            return self._invalid(
                f"prompts must be 1 to {MAX_PROMPTS} objects, each with a title and a message"
            )
        if args.get("thread_ts"):
            return {"ok": True}  # silently nothing, for an agent-view app
        self.suggested_prompts.append(
            {"channel": str(channel), "title": args.get("title"), "prompts": items}
        )
        return {"ok": True}

    async def _api_reactions_add(self, args: dict[str, Any], token: str | None) -> dict[str, Any]:
        key = (str(args.get("channel")), str(args.get("timestamp")), str(args.get("name")))
        if key in self.reactions:
            return {"ok": False, "error": "already_reacted"}
        self.reactions.add(key)
        return {"ok": True}

    async def _api_reactions_remove(
        self, args: dict[str, Any], token: str | None
    ) -> dict[str, Any]:
        key = (str(args.get("channel")), str(args.get("timestamp")), str(args.get("name")))
        if key not in self.reactions:
            return {"ok": False, "error": "no_reaction"}
        self.reactions.discard(key)
        return {"ok": True}

    async def _api_users_info(self, args: dict[str, Any], token: str | None) -> dict[str, Any]:
        uid = str(args.get("user"))
        user = self.users.get(uid)
        if user is None:
            return {"ok": False, "error": "user_not_found"}
        return {
            "ok": True,
            "user": {
                "id": user.id,
                "name": user.name.lower(),
                "real_name": user.name,
                "is_admin": user.is_admin,
                "is_owner": user.is_owner,
                "is_primary_owner": user.is_primary_owner,
                "is_bot": user.is_bot,
                "profile": {"display_name": user.name, "real_name": user.name},
            },
        }

    async def _api_conversations_open(
        self, args: dict[str, Any], token: str | None
    ) -> dict[str, Any]:
        """A DM (one user) or group DM (2-8 users) with the bot, the same channel every
        time for the same people; Slack's errors for the cases a client can get wrong."""
        ident, refused = self._with_scope(
            token, "im:write", needed="channels:manage,groups:write,im:write,mpim:write"
        )
        if ident is None:
            return refused or {}
        if args.get("channel"):
            channel = str(args["channel"])
            if channel not in self.dms.values():
                return {"ok": False, "error": "channel_not_found"}
            return {"ok": True, "channel": {"id": channel}}
        users = [u for u in str(args.get("users") or "").split(",") if u]
        if not users:
            return {"ok": False, "error": "users_list_not_supplied"}
        if len(users) > 8:
            return {"ok": False, "error": "too_many_users"}
        for uid in users:
            user = self.users.get(uid)
            if user is None:
                return {"ok": False, "error": "user_not_found"}
            if user.is_bot:
                return {"ok": False, "error": "cannot_dm_bot"}
        return {"ok": True, "channel": {"id": self.dm_with(*users)}}

    def dm_with(self, *users: str) -> str:
        """The DM (one user) or group DM of these users with the bot, made on first use:
        the channel conversations.open gives and `app_home_opened` names."""
        key = ",".join(sorted(users))
        if key not in self.dms:
            prefix = "D" if len(users) == 1 else "G"
            self.dms[key] = f"{prefix}{next(self._ids):09d}"
        return self.dms[key]

    # -- files: the upload v2 flow (files.getUploadURLExternal, POST, complete) ----------

    def _with_scope(
        self, token: str | None, scope: str, needed: str | None = None
    ) -> tuple[Identity | None, dict[str, Any] | None]:
        """The token's identity, or the error Slack gives without one or without `scope`
        (`needed` lists every scope that would do, where Slack names several)."""
        ident = self._identity(token)
        if ident is None:
            return None, {"ok": False, "error": "not_authed" if not token else "invalid_auth"}
        if scope not in ident.scopes:
            return None, {
                "ok": False,
                "error": "missing_scope",
                "needed": needed or scope,
                "provided": ",".join(ident.scopes),
            }
        return ident, None

    @staticmethod
    def _invalid(*messages: str) -> dict[str, Any]:
        return {
            "ok": False,
            "error": "invalid_arguments",
            "response_metadata": {"messages": [f"[ERROR] {m}" for m in messages]},
        }

    async def _api_files_getUploadURLExternal(
        self, args: dict[str, Any], token: str | None
    ) -> dict[str, Any]:
        ident, refused = self._with_scope(token, "files:write")
        if ident is None:
            return refused or {}
        filename = args.get("filename")
        raw_length = args.get("length")
        missing = [
            k for k, v in (("filename", filename), ("length", raw_length)) if v in (None, "")
        ]
        if missing:
            return self._invalid(*(f"missing required field: {k}" for k in missing))
        try:
            length = int(str(raw_length))
        except ValueError:
            return self._invalid("invalid type for field: length")
        if length == 0:  # Slack documents missing_argument for exactly this case
            return {"ok": False, "error": "missing_argument"}
        if length < 0:
            return self._invalid("length must be a positive integer")
        alt_txt = args.get("alt_txt")
        if alt_txt is not None and len(str(alt_txt)) > MAX_ALT_TXT:
            return {"ok": False, "error": "alt_txt_too_large"}
        file_id = f"F{next(self._ids):09d}"
        key = f"{file_id}-{next(self._ids)}"
        self.uploads[file_id] = FakeUpload(
            file_id=file_id,
            key=key,
            team_id=ident.team_id,
            filename=str(filename),
            length=length,
            alt_txt=None if alt_txt is None else str(alt_txt),
            snippet_type=args.get("snippet_type"),
        )
        return {
            "ok": True,
            "upload_url": f"http://{self.host}:{self.port}/upload/v1/{key}",
            "file_id": file_id,
        }

    async def _upload(self, request: web.Request) -> web.Response:
        """The upload URL: the file's bytes, raw or as the file part of a multipart form.

        Stricter than Slack promises in one way: the bytes must be exactly the `length`
        given to files.getUploadURLExternal (a client that sends something else is wrong).
        """
        key = request.match_info["key"]
        upload = next((u for u in self.uploads.values() if u.key == key), None)
        if upload is None:
            return web.Response(status=404, text="unknown upload url")
        if request.content_type.startswith("multipart/"):
            data = b""
            reader = await request.multipart()
            async for part in reader:
                if isinstance(part, aiohttp.BodyPartReader) and part.filename is not None:
                    data = bytes(await part.read())
                    break
        else:
            data = await request.read()
        self.requests.append(
            RecordedRequest(path=request.path, args={"bytes": len(data)}, token=None)
        )
        await self._notify()
        if upload.completed or upload.data is not None:
            return web.Response(status=400, text="already uploaded")
        if len(data) != upload.length:
            return web.Response(status=400, text=f"expected {upload.length} bytes, got {len(data)}")
        upload.data = data
        upload.content_type = request.content_type
        await self._notify()
        return web.Response(text=f"OK - {len(data)}")

    async def _api_files_completeUploadExternal(
        self, args: dict[str, Any], token: str | None
    ) -> dict[str, Any]:
        ident, refused = self._with_scope(token, "files:write")
        if ident is None:
            return refused or {}
        raw = args.get("files")
        if raw in (None, ""):
            return self._invalid("missing required field: files")
        try:
            files = json.loads(raw) if isinstance(raw, str) else raw
        except ValueError:
            return self._invalid("invalid type for field: files")
        if (
            not isinstance(files, list)
            or not files
            or not all(isinstance(f, dict) and isinstance(f.get("id"), str) for f in files)
        ):
            return self._invalid("files must be a non-empty array of objects with an id")
        channels = [c for c in str(args.get("channels") or "").split(",") if c]
        if args.get("channel_id"):
            channels.insert(0, str(args["channel_id"]))
        thread_ts = args.get("thread_ts")
        if thread_ts and len(channels) != 1:
            return self._invalid("thread_ts needs exactly one channel")
        for channel in channels:
            if not _CHANNEL_ID.fullmatch(channel):
                return {"ok": False, "error": "channel_not_found"}
            if channel in self.not_in_channels:
                return {"ok": False, "error": "not_in_channel"}
        uploads = []
        for item in files:
            upload = self.uploads.get(item["id"])
            # Unknown, another team's, not uploaded yet, or already completed (the method
            # can be called once): to this caller the file does not exist.
            if (
                upload is None
                or upload.team_id != ident.team_id
                or upload.data is None
                or upload.completed
            ):
                return {"ok": False, "error": "file_not_found"}
            uploads.append((upload, item))
        for upload, item in uploads:
            upload.completed = True
            upload.title = item.get("title") or upload.filename
            upload.channels = tuple(channels)
            upload.initial_comment = args.get("initial_comment")
            upload.thread_ts = thread_ts
        return {
            "ok": True,
            "files": [{"id": u.file_id, "title": u.title} for u, _ in uploads],
        }

    async def _api_apps_connections_open(
        self, args: dict[str, Any], token: str | None
    ) -> dict[str, Any]:
        if not token or not token.startswith(self.app_token_prefix):
            return {"ok": False, "error": "invalid_auth"}
        return {"ok": True, "url": f"ws://{self.host}:{self.port}/link"}

    async def _api_oauth_v2_access(self, args: dict[str, Any], token: str | None) -> dict[str, Any]:
        grant = self.grants.get(str(args.get("code")))
        if grant is None:
            return {"ok": False, "error": "invalid_code"}
        self.identities.setdefault(
            grant.bot_token,
            Identity(
                team_id=grant.team_id,
                user_id=grant.bot_user_id,
                bot_id="B" + grant.team_id,
                scopes=grant.scopes,
            ),
        )
        return {
            "ok": True,
            "app_id": "A0001",
            "authed_user": {"id": grant.installer_id},
            "scope": ",".join(grant.scopes),
            "token_type": "bot",
            "access_token": grant.bot_token,
            "bot_user_id": grant.bot_user_id,
            "team": {"id": grant.team_id, "name": "Team " + grant.team_id},
            "enterprise": {"id": grant.enterprise_id} if grant.enterprise_id else None,
            "is_enterprise_install": False,
        }


# --------------------------------------------------------------------------------------
# Block Kit as Slack checks it (the kinds of block the bot sends, with their limits)

_TEXT_LIMITS = {"section": 3000, "markdown": 12000}
_BUTTON_TEXT = 75
_VALUE = 2000
_ID = 255


def _plain_text_errors(text: object, where: str, limit: int) -> list[str]:
    if not isinstance(text, dict) or text.get("type") != "plain_text":
        return [f"must be a plain_text object [json-pointer:{where}]"]
    body = text.get("text")
    if not isinstance(body, str) or not 1 <= len(body) <= limit:
        return [f"must be 1 to {limit} characters [json-pointer:{where}/text]"]
    return []


def _element_errors(element: object, where: str, ids: list[str]) -> list[str]:
    if not isinstance(element, dict):
        return [f"must be an object [json-pointer:{where}]"]
    errors: list[str] = []
    action_id = element.get("action_id")
    if action_id is not None:
        if not isinstance(action_id, str) or not 1 <= len(action_id) <= _ID:
            errors.append(f"must be 1 to {_ID} characters [json-pointer:{where}/action_id]")
        ids.append(str(action_id))
    kind = element.get("type")
    if kind == "button":
        errors += _plain_text_errors(element.get("text"), f"{where}/text", _BUTTON_TEXT)
        if len(str(element.get("value") or "")) > _VALUE:
            errors.append(f"must be at most {_VALUE} characters [json-pointer:{where}/value]")
        if element.get("style") not in (None, "primary", "danger"):
            errors.append(f"must be primary or danger [json-pointer:{where}/style]")
    elif kind == "feedback_buttons":
        if action_id is None:
            errors.append(f"missing required field: action_id [json-pointer:{where}]")
        for side in ("positive_button", "negative_button"):
            button = element.get(side)
            if not isinstance(button, dict):
                errors.append(f"missing required field: {side} [json-pointer:{where}]")
                continue
            errors += _plain_text_errors(button.get("text"), f"{where}/{side}/text", _BUTTON_TEXT)
            value = button.get("value")
            if not isinstance(value, str) or not 1 <= len(value) <= _VALUE:
                errors.append(f"must be 1 to {_VALUE} characters [json-pointer:{where}/{side}]")
    else:
        errors.append(f"unsupported element type {kind!r} [json-pointer:{where}/type]")
    return errors


def block_errors(blocks: object) -> list[str]:
    """What Slack would say is wrong with a message's `blocks` ([] when valid), for
    the block kinds this bot sends: section, markdown, actions (buttons) and
    context_actions (feedback buttons)."""
    if not isinstance(blocks, list) or not 1 <= len(blocks) <= 50:
        return ["must be a list of 1 to 50 blocks [json-pointer:/blocks]"]
    errors: list[str] = []
    ids: list[str] = []
    for i, block in enumerate(blocks):
        where = f"/blocks/{i}"
        if not isinstance(block, dict):
            errors.append(f"must be an object [json-pointer:{where}]")
            continue
        kind = block.get("type")
        if len(str(block.get("block_id") or "")) > _ID:
            errors.append(f"must be at most {_ID} characters [json-pointer:{where}/block_id]")
        if kind == "section":
            text = block.get("text")
            if not isinstance(text, dict) or text.get("type") not in ("mrkdwn", "plain_text"):
                errors.append(f"must be a text object [json-pointer:{where}/text]")
            elif not 1 <= len(str(text.get("text") or "")) <= _TEXT_LIMITS["section"]:
                errors.append(f"must be 1 to 3000 characters [json-pointer:{where}/text/text]")
        elif kind == "markdown":
            if not 1 <= len(str(block.get("text") or "")) <= _TEXT_LIMITS["markdown"]:
                errors.append(f"must be 1 to 12000 characters [json-pointer:{where}/text]")
        elif kind in ("actions", "context_actions"):
            most = 25 if kind == "actions" else 5
            elements = block.get("elements")
            if not isinstance(elements, list) or not 1 <= len(elements) <= most:
                errors.append(f"must hold 1 to {most} elements [json-pointer:{where}/elements]")
                continue
            allowed = ("button",) if kind == "actions" else ("feedback_buttons", "icon_button")
            for j, element in enumerate(elements):
                at = f"{where}/elements/{j}"
                if isinstance(element, dict) and element.get("type") not in allowed:
                    errors.append(f"not allowed in {kind} [json-pointer:{at}/type]")
                else:
                    errors += _element_errors(element, at, ids)
        else:
            errors.append(f"unsupported block type {kind!r} [json-pointer:{where}/type]")
    repeated = sorted({i for i in ids if ids.count(i) > 1})
    errors += [f"action_id {i!r} is used twice in one message" for i in repeated]
    return errors


def _blocks_of(args: dict[str, Any]) -> tuple[list[Any] | None, dict[str, Any] | None]:
    """A Web API call's `blocks` (JSON, or a JSON string in a form), or Slack's error."""
    raw = args.get("blocks")
    if raw in (None, ""):
        return None, None
    try:
        blocks = json.loads(raw) if isinstance(raw, str) else raw
    except ValueError:
        return None, {"ok": False, "error": "invalid_blocks_format"}
    errors = block_errors(blocks)
    if errors:
        return None, {
            "ok": False,
            "error": "invalid_blocks",
            "errors": errors,
            "response_metadata": {"messages": [f"[ERROR] {e}" for e in errors]},
        }
    return blocks, None


def interaction_form(payload: dict[str, Any]) -> dict[str, str]:
    """How Slack posts an interaction to the Request URL: one form field, `payload`."""
    return {"payload": json.dumps(payload)}


# --------------------------------------------------------------------------------------
# The events Slack sends when the app leaves a workspace (Events API envelopes)


def app_uninstalled_event(*, team: str, event_id: str, api_app_id: str = "A0001") -> dict[str, Any]:
    """An admin removed the app from the workspace: every token of it there is revoked
    by then, so the envelope carries no `authorizations` to look a token up with."""
    return {
        "token": "legacy-verification-token",
        "team_id": team,
        "api_app_id": api_app_id,
        "event": {"type": "app_uninstalled"},
        "type": "event_callback",
        "event_id": event_id,
        "event_time": int(time.time()),
    }


def tokens_revoked_event(
    *,
    team: str,
    event_id: str,
    bot: list[str] | None = None,
    oauth: list[str] | None = None,
    api_app_id: str = "A0001",
) -> dict[str, Any]:
    """Tokens of the app were revoked; `tokens` lists the USER ids whose tokens went,
    keyed by kind (`bot` for the bot user's xoxb token, `oauth` for users' xoxp)."""
    tokens: dict[str, list[str]] = {}
    if oauth:
        tokens["oauth"] = oauth
    if bot:
        tokens["bot"] = bot
    return {
        "token": "legacy-verification-token",
        "team_id": team,
        "api_app_id": api_app_id,
        "event": {"type": "tokens_revoked", "tokens": tokens},
        "type": "event_callback",
        "event_id": event_id,
        "event_time": int(time.time()),
    }


# --------------------------------------------------------------------------------------
# A member deletes or edits a message (Events API envelopes)
#
# Slack sends both as `message` events with a subtype, only to apps subscribed to the
# conversation's message events (message.im for DMs, message.channels / message.groups
# for channels), never as app_mention. Neither says who deleted or edited: the
# envelope's `authorizations` is the app's, and the event's own `ts` is the event's, not
# the message's (that is `deleted_ts`, or the inner `message.ts`).


def event_envelope(
    team: str, event_id: str, event: dict[str, Any], *, event_time: int | None = None
) -> dict[str, Any]:
    """An Events API delivery of `event` from `team`, authorized for the bot user UBOT."""
    return {
        "token": "legacy-verification-token",
        "team_id": team,
        "api_app_id": "A0001",
        "event": event,
        "type": "event_callback",
        "event_id": event_id,
        "event_time": int(time.time()) if event_time is None else event_time,
        "authorizations": [
            {
                "enterprise_id": None,
                "team_id": team,
                "user_id": "UBOT",
                "is_bot": True,
                "is_enterprise_install": False,
            }
        ],
        "is_ext_shared_channel": False,
    }


def _channel_type(channel: str) -> str:
    return {"D": "im", "G": "group"}.get(channel[:1], "channel")


def message_deleted_event(
    *,
    team: str,
    event_id: str,
    channel: str,
    deleted_ts: str,
    previous: dict[str, Any] | None = None,
    event_ts: str = "1800000000.000100",
) -> dict[str, Any]:
    """The message at `deleted_ts` was deleted. `previous` is the message as it was
    (Slack includes it as `previous_message` where the app could read it)."""
    event: dict[str, Any] = {
        "type": "message",
        "subtype": "message_deleted",
        "hidden": True,
        "channel": channel,
        "ts": event_ts,
        "deleted_ts": deleted_ts,
        "event_ts": event_ts,
        "channel_type": _channel_type(channel),
    }
    if previous is not None:
        event["previous_message"] = previous
    return event_envelope(team, event_id, event)


def message_changed_event(
    *,
    team: str,
    event_id: str,
    channel: str,
    ts: str,
    user: str,
    text: str,
    previous_text: str,
    edited_ts: str = "1800000000.000200",
    thread_ts: str | None = None,
) -> dict[str, Any]:
    """`user` edited their message at `ts` (whose text was `previous_text`) to `text`:
    the event carries the whole new message, with `edited`, and the previous one."""
    message: dict[str, Any] = {
        "type": "message",
        "user": user,
        "text": text,
        "ts": ts,
        "team": team,
        "edited": {"user": user, "ts": edited_ts},
    }
    previous: dict[str, Any] = {
        "type": "message",
        "user": user,
        "text": previous_text,
        "ts": ts,
        "team": team,
    }
    if thread_ts is not None:
        message["thread_ts"] = previous["thread_ts"] = thread_ts
    event = {
        "type": "message",
        "subtype": "message_changed",
        "hidden": True,
        "channel": channel,
        "ts": edited_ts,
        "event_ts": edited_ts,
        "message": message,
        "previous_message": previous,
        "channel_type": _channel_type(channel),
    }
    return event_envelope(team, event_id, event)


def message_tombstoned_event(
    *,
    team: str,
    event_id: str,
    channel: str,
    ts: str,
    previous: dict[str, Any],
    replies: Sequence[tuple[str, str]],
    event_ts: str = "1800000000.000300",
) -> dict[str, Any]:
    """The message at `ts`, a thread parent with `replies` ((user, ts) each), was
    deleted: Slack sends no `message_deleted` while a reply is left but this
    `message_changed`, whose message is a `tombstone` in its place (same ts, posted by
    Slackbot); `previous` is the message as it was."""
    users = list(dict.fromkeys(user for user, _ in replies))
    tombstone: dict[str, Any] = {
        "type": "message",
        "subtype": "tombstone",
        "text": "This message was deleted.",
        "user": "USLACKBOT",
        "hidden": True,
        "ts": ts,
        "thread_ts": ts,
        "parent_user_id": "USLACKBOT",
        "reply_count": len(replies),
        "reply_users_count": len(users),
        "latest_reply": max(reply_ts for _, reply_ts in replies),
        "reply_users": users,
        "is_locked": False,
    }
    event = {
        "type": "message",
        "subtype": "message_changed",
        "hidden": True,
        "channel": channel,
        "ts": event_ts,
        "event_ts": event_ts,
        "message": tombstone,
        "previous_message": {**previous, "ts": ts, "thread_ts": ts},
        "channel_type": _channel_type(channel),
    }
    return event_envelope(team, event_id, event)


# --------------------------------------------------------------------------------------
# Signing requests the way Slack does


def sign(secret: str, body: bytes, timestamp: int | None = None) -> dict[str, str]:
    """Headers for a Slack-signed request: v0=HMAC-SHA256(secret, "v0:{ts}:{body}")."""
    ts = str(int(time.time()) if timestamp is None else timestamp)
    base = b"v0:" + ts.encode() + b":" + body
    digest = hmac.new(secret.encode(), base, hashlib.sha256).hexdigest()
    return {"X-Slack-Request-Timestamp": ts, "X-Slack-Signature": "v0=" + digest}


async def post_signed(
    session: aiohttp.ClientSession,
    url: str,
    secret: str,
    *,
    json_body: dict[str, Any] | None = None,
    form: dict[str, str] | None = None,
    timestamp: int | None = None,
    retry_num: int | None = None,
    tamper: bool = False,
) -> tuple[int, str, float]:
    """POST exactly the signed bytes; returns (status, body text, seconds taken).

    Events go as JSON, slash commands form-encoded, like Slack sends them. `tamper`
    changes the body after signing (the signature then must not verify).
    """
    if form is not None:
        body = urllib.parse.urlencode(form).encode()
        ctype = "application/x-www-form-urlencoded"
    else:
        body = json.dumps(json_body or {}).encode()
        ctype = "application/json"
    headers = {"Content-Type": ctype, **sign(secret, body, timestamp)}
    if retry_num is not None:
        headers["X-Slack-Retry-Num"] = str(retry_num)
        headers["X-Slack-Retry-Reason"] = "http_timeout"
    if tamper:
        body = body + b" "
    started = time.monotonic()
    async with session.post(url, data=body, headers=headers) as resp:
        text = await resp.text()
        return resp.status, text, time.monotonic() - started
