"""A loopback fake of the Anthropic Messages API for tests and benchmarks.

Why a server and not a mock: the project's rule is that tests drive the real
`anthropic.AsyncAnthropic` client, so its HTTP stack, auth headers, retries (with
`retry-after-ms`), timeouts and response parsing are exercised exactly as in
production. This server speaks the wire format the SDK expects: `POST /v1/messages`
answers with a real-shaped `message` object, and failures use the real error envelope
`{"type": "error", "error": {"type": ..., "message": ...}}` with the real statuses.

How a request is answered, in order:

1. `server.latency` seconds pass (every request, faults included: benchmark realism).
2. A missing or wrong key (when the server was given `api_key`) gets 401; a malformed
   body gets 400. Neither consumes the script.
3. The next item of the script queue (`server.enqueue(...)`), if any: `Text`,
   `ToolUse`, `Fault` or `Delay` (wait, then answer with `Delay.then` or the brain).
   Items are taken in arrival order, so concurrent calls should use brain rules.
4. Otherwise the deterministic `Brain` (see its docstring), so pipeline tests and
   benchmarks run without scripting every call.

Everything the client sent is in `server.requests` (headers + JSON body), and
`server.max_in_flight` is the peak number of requests being handled at once.

Prompt caching follows Anthropic's documented rules, because a kinder fake once made
the bot report cache hits production never got: the cacheable prefix runs in the order
tools, system, messages up to a block marked `cache_control` (at most 4 such blocks,
more is a 400); a prefix shorter than the model's minimum is never cached; a read needs
an identical prefix written before by the same model and still alive (5 minutes,
refreshed on every hit; `"ttl": "1h"` for an hour), found at a breakpoint or up to 20
blocks before one; a write covers what lies between the read and the last breakpoint.
Tokens are estimated as one per 4 characters of each block.

Turns follow its rules for roles and text (`_invalid_turns`): "user" or "assistant"
only, no empty content, no text block that is empty or only whitespace, in the messages
or the system prompt; the real API refuses each with a 400.

Images follow Anthropic's rules for `image` blocks with a base64 source: a user turn
only; media type one of JPEG, PNG, GIF, WebP and the one the bytes really are; valid
base64; at most 5 MB of base64 text; at most 8000 pixels a side (2000 once a request
carries more than 20 images); at most 100 images a request. Each breach is the API's
400 `invalid_request_error` naming the block (`messages.0.content.1.image.source...`).
Every image that arrived is in `request.images` as (media type, bytes), and counts as
(width x height) / 750 tokens after the API's downscaling to 1568 pixels a side.

Streaming (`"stream": true`) answers in Anthropic's server-sent events: message_start
(with the input and cache usage), content_block_start, ping, one content_block_delta
`text_delta` per word, content_block_stop, message_delta (stop reason, output usage),
message_stop. Every rule above applies first, so a refused request is a plain error
response, as the real API gives before a stream starts. `server.first_token_seconds`
and `server.tokens_per_second` pace the words (0: no pacing). A `Broken` script item
streams part of its text, then breaks: `how="error"` sends the `error` event
(`overloaded_error`) the way Anthropic does mid-stream, `how="drop"` cuts the
connection.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import html
import io
import json
import math
import re
import time
import uuid
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Self

from aiohttp import web
from PIL import Image

# --- script items ------------------------------------------------------------------------


@dataclass(frozen=True)
class Text:
    """A text answer. A sequence gives several text blocks (the client must join them).

    `usage` overrides fields of the computed usage, e.g. `{"cache_read_input_tokens": None}`
    to send an explicit null as the API may.
    """

    text: str | Sequence[str]
    usage: dict[str, int | None] | None = None


@dataclass(frozen=True)
class ToolUse:
    """A `tool_use` answer for the tool the request forces."""

    input: dict[str, Any]


@dataclass(frozen=True)
class Fault:
    """An error response in the real envelope. Without `retry_after_ms` the SDK backs
    off 0.5 s, 1 s, ... so tests should give a small one."""

    status: int
    retry_after_ms: int | None = None  # the `retry-after-ms` header


@dataclass(frozen=True)
class Delay:
    """Hold the request `seconds` longer (to trigger client timeouts), then answer with
    `then`, or with the brain when `then` is None."""

    seconds: float
    then: Text | ToolUse | Fault | None = None


@dataclass(frozen=True)
class Broken:
    """A streamed answer that breaks after about `after` characters of `text`."""

    text: str
    after: int
    how: Literal["error", "drop"] = "error"


ScriptItem = Text | ToolUse | Fault | Delay | Broken


def stream_pieces(text: str) -> list[str]:
    """How the fakes cut a streamed text: one piece per word with its trailing space
    (a token stands in for a word; the pacing counts pieces)."""
    return re.findall(r"\S+\s*|\s+", text)


async def pace(index: int, first_token_seconds: float, tokens_per_second: float) -> None:
    """Wait before piece `index`: the time to first token, then 1/rate per piece."""
    if index == 0:
        if first_token_seconds > 0:
            await asyncio.sleep(first_token_seconds)
    elif tokens_per_second > 0:
        await asyncio.sleep(1.0 / tokens_per_second)


#: Model ids the fake's Models API knows (current ones and their dated aliases).
KNOWN_MODELS = (
    "claude-opus-4-6",
    "claude-opus-4-5",
    "claude-sonnet-4-6",
    "claude-sonnet-4-5",
    "claude-haiku-4-5",
    "claude-haiku-4-5-20251001",
    "claude-3-5-haiku-20241022",
    "claude-3-haiku-20240307",
)

ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    402: "billing_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    504: "timeout_error",
    529: "overloaded_error",
}


#: Shortest cacheable prefix per model, in tokens (Anthropic's prompt-caching docs,
#: read 2026-11). Keys are model-id prefixes; models not listed need 1,024.
CACHE_MINIMUM_TOKENS = {
    "claude-opus-4-6": 4096,
    "claude-opus-4-5": 4096,
    "claude-haiku-4-5": 4096,
    "claude-3-5-haiku": 2048,
    "claude-3-haiku": 2048,
}
DEFAULT_CACHE_MINIMUM = 1024
MAX_CACHE_BREAKPOINTS = 4
CACHE_LOOKBACK_BLOCKS = 20
CACHE_TTL_SECONDS = {"5m": 300.0, "1h": 3600.0}


def cache_minimum(model: str) -> int:
    best = max((k for k in CACHE_MINIMUM_TOKENS if model.startswith(k)), key=len, default=None)
    return CACHE_MINIMUM_TOKENS[best] if best else DEFAULT_CACHE_MINIMUM


# --- what the client sent ----------------------------------------------------------------


def _content_text(content: Any) -> str:
    """Text of a message `content`, which is a string or a list of content blocks (the
    text blocks' text; images are not text)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(
            str(block.get("text", ""))
            for block in content
            if isinstance(block, dict) and block.get("type", "text") == "text"
        )
    return ""


# --- images ------------------------------------------------------------------------------

#: The formats both vendors take, by the name Pillow gives each.
IMAGE_FORMATS = {"PNG": "image/png", "JPEG": "image/jpeg", "GIF": "image/gif", "WEBP": "image/webp"}
ANTHROPIC_IMAGE_TYPES = ("image/jpeg", "image/png", "image/gif", "image/webp")
MAX_IMAGE_BASE64 = 5 * 1024 * 1024
MAX_IMAGE_SIDE = 8000
MANY_IMAGES = 20
MANY_IMAGES_SIDE = 2000
MAX_IMAGES = 100
#: Anthropic scales an image down to this many pixels on its long side before reading it.
READ_SIDE = 1568


def image_facts(raw: bytes) -> tuple[str | None, int, int]:
    """(the media type the bytes really are, width, height), or (None, 0, 0) when they
    are no whole image of the four formats (decoded in full, as the API must)."""
    try:
        with Image.open(io.BytesIO(raw)) as image:
            image.load()
            return IMAGE_FORMATS.get(image.format or ""), image.size[0], image.size[1]
    except Exception:
        return None, 0, 0


def image_tokens(width: int, height: int) -> int:
    """Anthropic's estimate: (width x height) / 750 of the image as it is read."""
    scale = min(1.0, READ_SIDE / max(width, height, 1))
    return max(1, math.ceil(width * scale * height * scale / 750))


def _image_blocks(body: dict[str, Any]) -> list[tuple[int, int, dict[str, Any]]]:
    """(message index, block index, block) of every image block of the request."""
    found: list[tuple[int, int, dict[str, Any]]] = []
    for i, message in enumerate(body.get("messages") or []):
        content = message.get("content") if isinstance(message, dict) else None
        for j, block in enumerate(content if isinstance(content, list) else []):
            if isinstance(block, dict) and block.get("type") == "image":
                found.append((i, j, block))
    return found


def _decoded(block: dict[str, Any]) -> bytes:
    source = block.get("source") or {}
    return base64.b64decode(str(source.get("data", "")), validate=True)


def _invalid_images(body: dict[str, Any]) -> str | None:
    """The image checks of the Messages API (see the module docstring)."""
    blocks = _image_blocks(body)
    if len(blocks) > MAX_IMAGES:
        return f"messages: Too many images: {len(blocks)} > {MAX_IMAGES} maximum"
    sides: list[int] = []
    for i, j, block in blocks:
        where = f"messages.{i}.content.{j}"
        if body["messages"][i].get("role") != "user":
            return (
                f"{where}: Input tag 'image' found using 'type' does not match any of the "
                "expected tags: 'text', 'thinking', 'redacted_thinking', 'tool_use'"
            )
        source = block.get("source")
        if not isinstance(source, dict) or source.get("type") != "base64":
            return f"{where}.image.source: the fake takes base64 image sources only"
        media_type = source.get("media_type")
        if media_type not in ANTHROPIC_IMAGE_TYPES:
            return (
                f"{where}.image.source.base64.media_type: Input should be 'image/jpeg', "
                "'image/png', 'image/gif' or 'image/webp'"
            )
        data = source.get("data")
        if not isinstance(data, str) or not data:
            return f"{where}.image.source.base64.data: image cannot be empty"
        if len(data) > MAX_IMAGE_BASE64:
            return (
                f"{where}.image.source.base64: image exceeds 5 MB maximum: "
                f"{len(data)} bytes > {MAX_IMAGE_BASE64} bytes"
            )
        try:
            raw = _decoded(block)
        except ValueError:
            return f"{where}.image.source.base64.data: Invalid base64 data"
        actual, width, height = image_facts(raw)
        if actual is None:
            return f"{where}.image.source.base64.data: Could not process image"
        if actual != media_type:
            return (
                f"{where}.image.source.base64.data: Image does not match the provided "
                f"media type {media_type}"
            )
        if max(width, height) > MAX_IMAGE_SIDE:
            return (
                f"{where}.image.source.base64.data: At least one of the image dimensions "
                f"exceed max allowed size: {MAX_IMAGE_SIDE} pixels"
            )
        sides.append(max(width, height))
    if len(blocks) > MANY_IMAGES and max(sides, default=0) > MANY_IMAGES_SIDE:
        return (
            "messages: At least one of the image dimensions exceed max allowed size for "
            f"many-image requests: {MANY_IMAGES_SIDE} pixels"
        )
    return None


@dataclass
class RecordedRequest:
    method: str
    path: str
    headers: dict[str, str]  # names lower-cased
    body: dict[str, Any]

    @property
    def api_key(self) -> str | None:
        """The credential sent, whichever header carried it (SDK 2.x uses Bearer)."""
        if "x-api-key" in self.headers:
            return self.headers["x-api-key"]
        auth = self.headers.get("authorization", "")
        return auth[len("Bearer ") :] if auth.startswith("Bearer ") else None

    @property
    def system_blocks(self) -> list[dict[str, Any]]:
        system = self.body.get("system")
        if isinstance(system, str):
            return [{"type": "text", "text": system}]
        return [b for b in system or [] if isinstance(b, dict)]

    @property
    def system_text(self) -> str:
        return "".join(str(b.get("text", "")) for b in self.system_blocks)

    @property
    def messages(self) -> list[dict[str, Any]]:
        return [m for m in self.body.get("messages") or [] if isinstance(m, dict)]

    @property
    def user_text(self) -> str:
        """All user turns' text, joined by newlines."""
        return "\n".join(
            _content_text(m.get("content")) for m in self.messages if m.get("role") == "user"
        )

    @property
    def last_user_text(self) -> str:
        users = [m for m in self.messages if m.get("role") == "user"]
        return _content_text(users[-1].get("content")) if users else ""

    @property
    def images(self) -> list[tuple[str, bytes]]:
        """(media type, bytes) of every image the request carried, in order (only
        requests that passed validation hold decodable ones)."""
        found: list[tuple[str, bytes]] = []
        for _, _, block in _image_blocks(self.body):
            try:
                found.append((str(block["source"]["media_type"]), _decoded(block)))
            except (KeyError, TypeError, ValueError):
                continue
        return found

    @property
    def tools(self) -> list[dict[str, Any]]:
        return [t for t in self.body.get("tools") or [] if isinstance(t, dict)]

    @property
    def tool_name(self) -> str | None:
        """The forced tool's name (or the only/first tool offered); None for text calls."""
        choice = self.body.get("tool_choice")
        if isinstance(choice, dict) and choice.get("type") == "tool":
            return str(choice.get("name"))
        return str(self.tools[0].get("name")) if self.tools else None


# --- the default brain -------------------------------------------------------------------


@dataclass(frozen=True)
class EssRule:
    contains: str
    score: float
    direction: str = "neutral"
    topics: tuple[str, ...] = ()
    novelty: float = 0.5
    reasoning_type: str = "logical_argument"
    source_reliability: str = "informed_opinion"
    internal_consistency: bool = True
    summary: str | None = None


@dataclass(frozen=True)
class ReplyRule:
    contains: str
    text: str
    in_system: bool = False


def _plain(text: str) -> str:
    """Text without tags, entities unescaped and whitespace collapsed (as a model reads it)."""
    return " ".join(html.unescape(re.sub(r"<[^>]+>", " ", text)).split())


def _tagged(text: str, tag: str) -> str | None:
    # The innermost pair, so prose that mentions "<message> tags" before the section is skipped.
    open_tag, close_tag = re.escape(f"<{tag}>"), re.escape(f"</{tag}>")
    match = re.search(rf"{open_tag}((?:(?!{open_tag}).)*?){close_tag}", text, re.DOTALL)
    return html.unescape(match.group(1).strip()) if match else None


def _schema_default(prop: dict[str, Any]) -> Any:
    if prop.get("enum"):
        return prop["enum"][0]
    return {"number": 0.0, "integer": 0, "boolean": False, "array": [], "object": {}}.get(
        str(prop.get("type")), ""
    )


@dataclass
class Brain:
    """Deterministic stand-in for the model when the script queue is empty.

    * `classify_evidence` tool calls (`ess_tool_name`): the first `ess_rule` whose
      `contains` occurs (case-insensitively) in the rated message wins. The rated message
      is the text inside the user content's `<message>` tag (the engine's ESS prompt
      wraps it so), else the whole user content; this keeps words from the prompt's
      guide or the embedded personality from matching. Unmatched: score 0.02,
      no_argument, not_applicable, neutral, topics ["small_talk"], novelty 0.
      Summary: the rule's, else the first 100 chars of the message with tags stripped.
      Only the fields the request's `input_schema` declares are sent.
    * Other tool calls: a default per schema property (first enum value, 0, false, [], "").
    * Text calls: the first `reply_rule` whose `contains` occurs in the last user message
      (its `<message>` section when it has one; or in the system prompt with
      `in_system=True`); else, if the request contains a
      `<current_self_description>` section (the reflection prompt), the first 2000 chars
      of that section, so reflection keeps the snapshot as it was; else `"[reply] "` +
      the first 200 chars of the last user message.
    """

    ess_tool_name: str = "classify_evidence"
    ess_rules: list[EssRule] = field(default_factory=list)
    reply_rules: list[ReplyRule] = field(default_factory=list)

    def ess_rule(
        self,
        *,
        contains: str,
        score: float,
        direction: str = "neutral",
        topics: Sequence[str] = (),
        novelty: float = 0.5,
        reasoning_type: str = "logical_argument",
        source_reliability: str = "informed_opinion",
        internal_consistency: bool = True,
        summary: str | None = None,
    ) -> None:
        self.ess_rules.append(
            EssRule(
                contains,
                score,
                direction,
                tuple(topics),
                novelty,
                reasoning_type,
                source_reliability,
                internal_consistency,
                summary,
            )
        )

    def reply_rule(self, *, contains: str, text: str, in_system: bool = False) -> None:
        self.reply_rules.append(ReplyRule(contains, text, in_system))

    def answer(self, request: RecordedRequest) -> Text | ToolUse:
        tool = request.tool_name
        if tool is None:
            return Text(self._reply_text(request))
        schema = next(
            (t.get("input_schema") or {} for t in request.tools if t.get("name") == tool), {}
        )
        if tool == self.ess_tool_name:
            return ToolUse(self._ess_input(request, schema))
        props = schema.get("properties") or {}
        return ToolUse({k: _schema_default(p) for k, p in props.items()})

    def rated_message(self, request: RecordedRequest) -> str:
        user = request.user_text
        inner = _tagged(user, "message")
        return user if inner is None else inner

    def _ess_input(self, request: RecordedRequest, schema: dict[str, Any]) -> dict[str, Any]:
        message = self.rated_message(request)
        rule = next((r for r in self.ess_rules if r.contains.lower() in message.lower()), None)
        rule = rule or EssRule(
            contains="",
            score=0.02,
            topics=("small_talk",),
            novelty=0.0,
            reasoning_type="no_argument",
            source_reliability="not_applicable",
        )
        values: dict[str, Any] = {
            "score": rule.score,
            "reasoning_type": rule.reasoning_type,
            "source_reliability": rule.source_reliability,
            "internal_consistency": rule.internal_consistency,
            "novelty": rule.novelty,
            "topics": list(rule.topics),
            "summary": rule.summary if rule.summary is not None else _plain(message)[:100],
            "opinion_direction": rule.direction,
        }
        props: dict[str, Any] = schema.get("properties") or {}
        if not props:
            return values
        return {
            key: values[key] if key in values else _schema_default(prop)
            for key, prop in props.items()
        }

    def _reply_text(self, request: RecordedRequest) -> str:
        # What the member said: the `<message>` section of the turn when it has one
        # (the turn may also carry memories as context), else the whole turn.
        last_user = request.last_user_text
        said = _tagged(last_user, "message")
        last_user = last_user if said is None else said
        for rule in self.reply_rules:
            haystack = request.system_text if rule.in_system else last_user
            if rule.contains.lower() in haystack.lower():
                return rule.text
        own = _tagged(request.system_text + "\n" + request.user_text, "current_self_description")
        if own is not None:
            return own[:2000]
        return "[reply] " + last_user[:200]


# --- the server --------------------------------------------------------------------------


def _tokens(text: str) -> int:
    """Roughly 4 characters per token, like English text."""
    return math.ceil(len(text) / 4)


class AnthropicFake:
    """`async with AnthropicFake() as server:` listens on 127.0.0.1 (ephemeral port).

    `api_key`: when set, requests must carry exactly this key (x-api-key or Bearer);
    when None any non-empty key is accepted. Prompt caching is simulated: the first
    request with a given cached prefix (tools + system blocks up to the last one with
    `cache_control`) reports it as `cache_creation_input_tokens`, later ones as
    `cache_read_input_tokens`.
    """

    def __init__(self, *, api_key: str | None = None, latency: float = 0.0) -> None:
        self.expected_api_key = api_key
        # What `GET /v1/models/{id}` knows; other ids get the real 404 envelope.
        self.known_models: set[str] = set(KNOWN_MODELS)
        self.latency = latency
        # Pacing of streamed answers (0: as fast as the loop goes).
        self.first_token_seconds = 0.0
        self.tokens_per_second = 0.0
        self.brain = Brain()
        self.requests: list[RecordedRequest] = []
        self.in_flight = 0
        self.max_in_flight = 0
        self.base_url = ""
        self._script: deque[ScriptItem] = deque()
        # Prefix hash -> when that cache entry expires (on `clock`'s scale).
        self._cache: dict[str, float] = {}
        self.clock = time.monotonic
        self._runner: web.AppRunner | None = None

    def enqueue(self, *items: ScriptItem) -> None:
        self._script.extend(items)

    @property
    def script_left(self) -> int:
        return len(self._script)

    async def start(self) -> None:
        app = web.Application(client_max_size=32 * 1024 * 1024)
        app.router.add_post("/v1/messages", self._messages)
        app.router.add_get("/v1/models/{model_id}", self._model)
        app.router.add_route("*", "/{tail:.*}", self._not_found)
        # handler_cancellation: a client that timed out and hung up stops its handler, so
        # `in_flight` counts only requests someone still waits for.
        self._runner = web.AppRunner(
            app, handler_cancellation=True, access_log=None, shutdown_timeout=0.5
        )
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", 0).start()
        host, port = self._runner.addresses[0][:2]
        self.base_url = f"http://{host}:{port}"

    async def close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def _model(self, request: web.Request) -> web.Response:
        """`GET /v1/models/{id}`: the Models API, as the start-up check uses it."""
        recorded = RecordedRequest(
            method=request.method,
            path=request.path,
            headers={k.lower(): v for k, v in request.headers.items()},
            body={},
        )
        self.requests.append(recorded)
        key = recorded.api_key
        if not key or (self.expected_api_key is not None and key != self.expected_api_key):
            return _error(401, "authentication_error", "invalid x-api-key")
        # Only a scripted fault is for this endpoint; answers stay for the Messages API.
        head = self._script[0] if self._script else None
        if isinstance(head, Fault):
            self._script.popleft()
            return _fault(head)
        model_id = request.match_info["model_id"]
        if model_id not in self.known_models:
            return _error(404, "not_found_error", f"model: {model_id}")
        return web.json_response(
            {
                "type": "model",
                "id": model_id,
                "display_name": model_id,
                "created_at": "2025-10-01T00:00:00Z",
            }
        )

    async def _not_found(self, request: web.Request) -> web.Response:
        return _error(404, "not_found_error", f"{request.method} {request.path} not found")

    async def _messages(self, request: web.Request) -> web.StreamResponse:
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            return await self._answer(request)
        finally:
            self.in_flight -= 1

    async def _answer(self, request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        try:
            body = json.loads(raw)
        except ValueError:
            body = None
        recorded = RecordedRequest(
            method=request.method,
            path=request.path,
            headers={k.lower(): v for k, v in request.headers.items()},
            body=body if isinstance(body, dict) else {},
        )
        self.requests.append(recorded)
        if self.latency:
            await asyncio.sleep(self.latency)

        key = recorded.api_key
        if not key or (self.expected_api_key is not None and key != self.expected_api_key):
            return _error(401, "authentication_error", "invalid x-api-key")
        problem = "body is not a JSON object" if not isinstance(body, dict) else _invalid(body)
        if problem:
            return _error(400, "invalid_request_error", problem)

        item = self._script.popleft() if self._script else None
        if isinstance(item, Delay):
            await asyncio.sleep(item.seconds)
            item = item.then
        if item is None:
            item = self.brain.answer(recorded)
        if isinstance(item, Fault):
            return _fault(item)
        if body.get("stream") is True:
            return await self._stream(request, recorded, item)
        if isinstance(item, Broken):
            return _fault(Fault(529))  # without a stream there is nothing to break part-way
        return web.json_response(self._message(recorded, item), headers={"request-id": _id("req_")})

    async def _stream(
        self, request: web.Request, recorded: RecordedRequest, item: Text | ToolUse | Broken
    ) -> web.StreamResponse:
        """The answer as Anthropic streams it (see the module docstring)."""
        if isinstance(item, ToolUse):
            return _error(400, "invalid_request_error", "the fake streams text answers only")
        text = item.text if isinstance(item, Broken) else item
        message = self._message(recorded, text if isinstance(text, Text) else Text(text))
        full = "".join(block["text"] for block in message["content"])
        usage = dict(message["usage"])
        start_usage = {**usage, "output_tokens": 1}
        response = web.StreamResponse(
            headers={
                "content-type": "text/event-stream; charset=utf-8",
                "cache-control": "no-cache",
                "request-id": _id("req_"),
            }
        )
        await response.prepare(request)

        async def send(event: str, data: dict[str, Any]) -> None:
            line = f"event: {event}\ndata: {json.dumps(data)}\n\n"
            await response.write(line.encode())

        opening = {**message, "content": [], "stop_reason": None, "usage": start_usage}
        await send("message_start", {"type": "message_start", "message": opening})
        await send(
            "content_block_start",
            {
                "type": "content_block_start",
                "index": 0,
                "content_block": {"type": "text", "text": ""},
            },
        )
        await send("ping", {"type": "ping"})
        sent = 0
        for index, piece in enumerate(stream_pieces(full)):
            if isinstance(item, Broken) and sent >= item.after:
                if item.how == "drop":
                    assert request.transport is not None
                    request.transport.close()
                    return response
                await send(
                    "error",
                    {
                        "type": "error",
                        "error": {"type": "overloaded_error", "message": "Overloaded"},
                    },
                )
                await response.write_eof()
                return response
            await pace(index, self.first_token_seconds, self.tokens_per_second)
            delta = {"type": "text_delta", "text": piece}
            await send(
                "content_block_delta", {"type": "content_block_delta", "index": 0, "delta": delta}
            )
            sent += len(piece)
        await send("content_block_stop", {"type": "content_block_stop", "index": 0})
        await send(
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": "end_turn", "stop_sequence": None},
                "usage": {"output_tokens": usage["output_tokens"]},
            },
        )
        await send("message_stop", {"type": "message_stop"})
        await response.write_eof()
        return response

    def _message(self, request: RecordedRequest, item: Text | ToolUse) -> dict[str, Any]:
        content: list[dict[str, Any]]
        if isinstance(item, Text):
            parts = [item.text] if isinstance(item.text, str) else list(item.text)
            content = [{"type": "text", "text": part} for part in parts]
            stop_reason, output = "end_turn", "".join(parts)
            overrides = item.usage or {}
        else:
            name = request.tool_name or "tool"
            content = [{"type": "tool_use", "id": _id("toolu_"), "name": name, "input": item.input}]
            stop_reason, output, overrides = "tool_use", json.dumps(item.input), {}
        usage = self._usage(request, output)
        usage.update(overrides)
        return {
            "id": _id("msg_"),
            "type": "message",
            "role": "assistant",
            "model": request.body["model"],
            "content": content,
            "stop_reason": stop_reason,
            "stop_sequence": None,
            "usage": usage,
        }

    def _usage(self, request: RecordedRequest, output: str) -> dict[str, Any]:
        blocks = _prompt_blocks(request)
        total = sum(tokens for _, tokens, _ in blocks)
        model = str(request.body.get("model"))
        read, created = self._cache_lookup(model, blocks)
        return {
            "input_tokens": max(total - read - created, 1),
            "output_tokens": max(_tokens(output), 1),
            "cache_creation_input_tokens": created,
            "cache_read_input_tokens": read,
            "cache_creation": {
                "ephemeral_5m_input_tokens": created,
                "ephemeral_1h_input_tokens": 0,
            },
            "service_tier": "standard",
        }

    def _cache_lookup(
        self, model: str, blocks: list[tuple[str, int, str | None]]
    ) -> tuple[int, int]:
        """(tokens read from the cache, tokens written to it) for one request."""
        breakpoints = [i for i, (_, _, ttl) in enumerate(blocks) if ttl is not None]
        if not breakpoints:
            return 0, 0
        now = self.clock()
        digest = hashlib.sha256(model.encode())
        keys: list[str] = []
        ends: list[int] = []
        running = 0
        for text, tokens, _ in blocks:
            digest.update(b"\0" + text.encode())
            keys.append(digest.copy().hexdigest())
            running += tokens
            ends.append(running)
        hit = -1
        for point in breakpoints:
            for index in range(point, max(-1, point - CACHE_LOOKBACK_BLOCKS - 1), -1):
                expires = self._cache.get(keys[index])
                if expires is not None and expires > now:
                    hit = max(hit, index)
                    break
        read = ends[hit] if hit >= 0 else 0
        minimum = cache_minimum(model)
        written = -1
        for point in breakpoints:
            ttl = CACHE_TTL_SECONDS[blocks[point][2] or "5m"]
            if point >= hit and ends[point] >= minimum:
                self._cache[keys[point]] = max(self._cache.get(keys[point], 0.0), now + ttl)
                if point > hit:
                    written = point
        if hit >= 0:
            self._cache[keys[hit]] = max(self._cache[keys[hit]], now + CACHE_TTL_SECONDS["5m"])
        created = ends[written] - read if written >= 0 else 0
        return read, created


def _prompt_blocks(request: RecordedRequest) -> list[tuple[str, int, str | None]]:
    """The prompt as the cache sees it: (identity text, tokens, cache ttl or None) per
    block, in the order tools, system, messages."""
    blocks: list[tuple[str, int, str | None]] = []

    def add(identity: str, text: str, marker: Any) -> None:
        blocks.append((identity, _tokens(text), _ttl({"cache_control": marker})))

    for tool in request.tools:
        text = json.dumps({k: v for k, v in tool.items() if k != "cache_control"})
        add("tool:" + text, text, tool.get("cache_control"))
    for block in request.system_blocks:
        text = str(block.get("text", ""))
        add("system:" + text, text, block.get("cache_control"))
    for message in request.messages:
        role = str(message.get("role"))
        content = message.get("content")
        if isinstance(content, str):
            add(f"{role}:" + content, content, None)
            continue
        for block in content if isinstance(content, list) else []:
            if isinstance(block, dict) and block.get("type") == "image":
                raw = _decoded(block)
                _, width, height = image_facts(raw)
                identity = f"{role}:image:" + hashlib.sha256(raw).hexdigest()
                blocks.append((identity, image_tokens(width, height), _ttl(block)))
            elif isinstance(block, dict):
                text = str(block.get("text", ""))
                add(f"{role}:" + text, text, block.get("cache_control"))
    return blocks


def _ttl(block: dict[str, Any]) -> str | None:
    marker = block.get("cache_control")
    return str(marker.get("ttl") or "5m") if isinstance(marker, dict) else None


def _id(prefix: str) -> str:
    return prefix + uuid.uuid4().hex[:24]


def _invalid_turns(body: dict[str, Any]) -> str | None:
    """The API's rules for roles and text: a role is "user" or "assistant" (consecutive
    turns of one role are merged, and the first may be either); a message's content is
    not empty, and no text block is empty or only whitespace, in the messages or the
    system prompt (the one exception: a last assistant turn, a prefill, may be empty but
    may not end in whitespace)."""
    messages: list[Any] = body["messages"]
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or message.get("role") not in ("user", "assistant"):
            return f"messages.{i}.role: Input should be 'user' or 'assistant'"
        content = message.get("content")
        prefill = i == len(messages) - 1 and message["role"] == "assistant"
        texts: list[Any]
        if isinstance(content, str):
            texts = [content]
        elif isinstance(content, list):
            texts = [
                b.get("text") for b in content if isinstance(b, dict) and b.get("type") == "text"
            ]
        else:
            return f"messages.{i}.content: Input should be a valid string or list"
        if not content:
            if prefill:
                continue
            return (
                f"messages.{i}: all messages must have non-empty content except for the "
                "optional final assistant message"
            )
        for text in texts:
            if not isinstance(text, str) or not text:
                return "messages: text content blocks must be non-empty"
            if not text.strip():
                return "messages: text content blocks must contain non-whitespace text"
            if prefill and text != text.rstrip():
                return "messages: final assistant content cannot end with trailing whitespace"
    system = body.get("system")
    blocks = [system] if isinstance(system, str) and system else system or []
    for block in blocks if isinstance(blocks, list) else []:
        text = block if isinstance(block, str) else block.get("text")
        if not isinstance(text, str) or not text:
            return "system: text content blocks must be non-empty"
        if not text.strip():
            return "system: text content blocks must contain non-whitespace text"
    return None


def _invalid(body: dict[str, Any]) -> str | None:
    """The checks the real API makes that a client bug would trip."""
    if not isinstance(body.get("model"), str) or not body["model"]:
        return "model: Field required"
    if not isinstance(body.get("max_tokens"), int) or body["max_tokens"] < 1:
        return "max_tokens: Field required and must be at least 1"
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        return "messages: at least one message is required"
    turns = _invalid_turns(body)
    if turns is not None:
        return turns
    images = _invalid_images(body)
    if images is not None:
        return images
    marked = sum(1 for block in _prompt_blocks(RecordedRequest("", "", {}, body)) if block[2])
    if marked > MAX_CACHE_BREAKPOINTS:
        return (
            f"A maximum of {MAX_CACHE_BREAKPOINTS} blocks with cache_control may be "
            f"provided. Found {marked}."
        )
    choice = body.get("tool_choice")
    if isinstance(choice, dict) and choice.get("type") == "tool":
        names = [t.get("name") for t in body.get("tools") or [] if isinstance(t, dict)]
        if choice.get("name") not in names:
            return f"tool_choice: tool {choice.get('name')!r} not found in tools"
    return None


def _error(
    status: int, error_type: str, message: str, headers: dict[str, str] | None = None
) -> web.Response:
    request_id = _id("req_")
    body = {
        "type": "error",
        "error": {"type": error_type, "message": message},
        "request_id": request_id,
    }
    return web.json_response(
        body, status=status, headers={"request-id": request_id, **(headers or {})}
    )


def _fault(fault: Fault) -> web.Response:
    headers: dict[str, str] = {}
    if fault.retry_after_ms is not None:
        headers["retry-after-ms"] = str(fault.retry_after_ms)
    error_type = ERROR_TYPES.get(fault.status, "api_error")
    return _error(fault.status, error_type, "Scripted fault from the fake server.", headers)
