"""A loopback fake of the OpenAI Chat Completions API, and of the servers that imitate it.

Why a server and not a mock: tests drive the real `openai.AsyncOpenAI` client, so its
HTTP stack, auth header, retries (`retry-after-ms` / `retry-after`), timeouts and
response parsing run exactly as in production. Why this strict: a fake kinder than the
real API hides client bugs, so bodies are validated the way OpenAI validates them and
every failure uses OpenAI's envelope `{"error": {"message", "type", "param", "code"}}`
with the real status.

It has the same public surface as `AnthropicFake` (`brain`, `requests`, `enqueue` with
the same `Text` / `ToolUse` / `Fault` / `Delay` items, `latency`, `in_flight`,
`max_in_flight`, `base_url`, `known_models`), so a test can be parametrized over both
vendors. `base_url` ends in `/v1`, as OPENAI_BASE_URL does.

How `POST /v1/chat/completions` is answered, in order:

1. `server.latency` seconds pass.
2. A missing or wrong key, when the server was given `api_key`, gets 401 (without an
   `api_key` it takes any key or none, like Ollama). An invalid body gets 400, an
   unknown model 404. None of these consume the script.
3. What the configured server lacks gets 400, as local servers answer:
   `rejects_tools`, `supports_response_format=False`, `rejects_max_tokens` (OpenAI's
   reasoning models: `unsupported_parameter`, use `max_completion_tokens`).
4. The next script item, else the deterministic `Brain` of `anthropic_server`. The
   answer takes the form the request asked for: a forced function call becomes a
   `tool_calls` message (unless `ignores_tool_choice`: then text; with
   `malformed_arguments` the arguments are not valid JSON); a `response_format` JSON
   schema becomes JSON content; a request whose system prompt asks for "only a JSON
   object" and embeds the schema (what `providers.openai` sends as its last resort) is
   answered as a small local model would, JSON in a ```json fence after a short
   preface. So the brain's evidence answer can be had at every level of the client's
   fallback chain.
5. An answer longer than the request's `max_tokens` (or `max_completion_tokens`) is
   cut there, at 4 characters a token, with `finish_reason: "length"`, as every server
   does: text, JSON content and a function call's arguments alike.

`llama_cpp=True` plays llama.cpp's server (`llama-server`, or the `xllamacpp` wheel)
instead of OpenAI, where the two differ in ways a client can trip on:
`tool_choice` must be a string ("none", "auto", "required"): an object is not an
error but logged and read as "auto", so the model answers in prose instead of calling
the tool; fields OpenAI does not know are ignored rather than refused, so llama.cpp's
own sampling fields (`repeat_penalty`, `top_k`, `min_p`, ...) pass; and there is no
`GET /v1/models/{id}` (404 "File Not Found"). With `ignores_tool_choice` as well it is
a model whose chat template has no tool support, which llama.cpp answers in prose
even when the tool is required.

Usage follows OpenAI's automatic prompt caching: only prompts of at least 1,024 tokens
are cached; the cached part is the longest prefix identical to a prompt sent before to
the same model and still alive, counted in 128-token steps (1,024, 1,152, ...); a cached
prompt lives 5 minutes after its last use (the short end of OpenAI's "5 to 10 minutes of
inactivity"; 24 hours with `prompt_cache_retention: "24h"`), on `server.clock`'s scale;
tokens are estimated as ceil(chars / 4) of a canonical serialization (tools, then the
response format, then the messages in order). `Text(usage=...)` overrides OpenAI usage
fields (`prompt_tokens`, `completion_tokens`, `total_tokens`, `prompt_tokens_details`,
..., and `cached_tokens` for the one inside `prompt_tokens_details`); `None` sends an
explicit null.

Everything the client sent is in `server.requests`, every completion sent back in
`server.responses`; `server.gate` (an unset `asyncio.Event`) holds chat requests after
they are recorded, and `wait_for_requests(n)` waits for arrivals, so concurrency tests
need no timing.

Images are `image_url` parts of a user message, checked as OpenAI checks them: a data URL
`data:<image MIME type>;base64,<data>` (each other form is the API's 400 `invalid_value`
naming the part), bytes that are a PNG, JPEG, GIF or WebP image of at most 20 MB (else
400 `invalid_image_format`), at most 500 a request, and only to a model that reads images
(`text_only_models`, the local names by default: 400 "Invalid content type. image_url
is only supported by certain models."). Every image that arrived is in
`request.images` as (media type, bytes) and counts as 85 tokens plus 170 per 512-pixel
tile, as OpenAI's GPT-4o counts a high-detail image.

`GET /v1/models` lists `known_models`; `GET /v1/models/{id}` answers for a known id and
with the real 404 `model_not_found` envelope otherwise (`serves_model_lookup=False`
answers 404 `{"detail": "Not Found"}` instead, like servers without that endpoint).
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import math
import re
import time
import uuid
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, Self
from urllib.parse import unquote

from aiohttp import web

from tests.fakes.anthropic_server import (
    Brain,
    Broken,
    Delay,
    Fault,
    RecordedRequest,
    ScriptItem,
    Text,
    ToolUse,
    _content_text,
    image_facts,
    pace,
    stream_pieces,
)

__all__ = [
    "KNOWN_MODELS",
    "Brain",
    "Broken",
    "Delay",
    "Fault",
    "OpenAIFake",
    "OpenAIRequest",
    "Text",
    "ToolUse",
]

#: Model ids the fake knows: OpenAI's current chat models and three local (Ollama)
#: names, two of them text-only and one (`qwen2.5vl`) a vision model.
KNOWN_MODELS = (
    "gpt-4.1",
    "gpt-4.1-mini",
    "gpt-4.1-nano",
    "gpt-4o",
    "gpt-4o-mini",
    "gpt-5",
    "gpt-5-mini",
    "gpt-5-nano",
    "o3",
    "o4-mini",
    "llama3.1:8b",
    "qwen2.5:7b",
    "qwen2.5vl:7b",
)

#: Models of KNOWN_MODELS that take text only (an image to them is a 400).
TEXT_ONLY_MODELS = ("llama3.1:8b", "qwen2.5:7b")
MAX_IMAGE_BYTES = 20 * 1024 * 1024
MAX_IMAGES = 500
_DATA_URL = re.compile(r"data:([^;,]*)((?:;[^;,]*)*),(.*)", re.DOTALL)
_PART_TYPES: dict[str, tuple[str, ...]] = {
    "user": ("text", "image_url", "input_audio", "file"),
    "assistant": ("text", "refusal"),
}

#: Prompts shorter than this are never cached; longer ones in steps of CACHE_STEP.
CACHE_MIN_TOKENS = 1024
CACHE_STEP = 128
#: How long a cached prompt lives after its last use, by `prompt_cache_retention`.
CACHE_TTL_SECONDS: dict[str | None, float] = {None: 300.0, "in_memory": 300.0, "24h": 86_400.0}

_ROLES = ("system", "assistant", "user", "function", "tool", "developer")
_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
_PARAMETERS = frozenset(
    {
        "messages",
        "model",
        "audio",
        "frequency_penalty",
        "function_call",
        "functions",
        "logit_bias",
        "logprobs",
        "max_completion_tokens",
        "max_tokens",
        "metadata",
        "modalities",
        "n",
        "parallel_tool_calls",
        "prediction",
        "presence_penalty",
        "prompt_cache_key",
        "prompt_cache_retention",
        "reasoning_effort",
        "response_format",
        "safety_identifier",
        "seed",
        "service_tier",
        "stop",
        "store",
        "stream",
        "stream_options",
        "temperature",
        "tool_choice",
        "tools",
        "top_logprobs",
        "top_p",
        "user",
        "verbosity",
        "web_search_options",
    }
)

# type and message of a scripted fault, by status (code: `rate_limit_exceeded` for 429).
_FAULTS: dict[int, tuple[str, str]] = {
    400: ("invalid_request_error", "Scripted bad request."),
    401: ("invalid_request_error", "Incorrect API key provided."),
    403: ("request_forbidden", "Country, region, or territory not supported"),
    404: ("invalid_request_error", "Scripted not found."),
    409: ("invalid_request_error", "Scripted conflict."),
    429: ("requests", "Rate limit reached for requests. Please try again later."),
    500: ("server_error", "The server had an error while processing your request. Sorry!"),
    502: ("server_error", "Bad gateway."),
    503: ("server_error", "The engine is currently overloaded, please try again later."),
}


def _tokens(text: str) -> int:
    """Roughly 4 characters per token, like English text."""
    return math.ceil(len(text) / 4)


# --- what the client sent ----------------------------------------------------------------

Structure = Literal["tool", "response_format", "instruction"]
_INSTRUCTION = re.compile(r"only a JSON object", re.IGNORECASE)


def _embedded_request(text: str) -> tuple[str, dict[str, Any]] | None:
    """(name, schema) when `text` asks for "only a JSON object" and embeds its schema."""
    found = _INSTRUCTION.search(text)
    if found is None:
        return None
    rest = text[found.end() :]
    name = re.search(r"`([a-zA-Z0-9_-]{1,64})`", rest)
    decoder = json.JSONDecoder()
    start = rest.find("{")
    while start != -1:
        try:
            value, _ = decoder.raw_decode(rest, start)
        except ValueError:
            value = None
        if isinstance(value, dict) and "properties" in value:
            return (name.group(1) if name else "answer"), value
        start = rest.find("{", start + 1)
    return None


@dataclass
class OpenAIRequest:
    """One request as received, with the same properties as `RecordedRequest`.

    `system_blocks` / `system_text` come from the system (and developer) messages, and
    `messages` are the other ones, so tests read both vendors' requests alike. `tools`
    lists function tools as `{"name", "description", "input_schema"}`. `tool_name` is
    the name of the JSON answer asked for, however it was asked (forced or only tool,
    `response_format` schema name, or the plain-text instruction); None for chat.
    """

    method: str
    path: str
    headers: dict[str, str]  # names lower-cased
    body: dict[str, Any]

    @property
    def api_key(self) -> str | None:
        auth = self.headers.get("authorization", "")
        return auth[len("Bearer ") :] if auth.startswith("Bearer ") else None

    @property
    def all_messages(self) -> list[dict[str, Any]]:
        return [m for m in self.body.get("messages") or [] if isinstance(m, dict)]

    @property
    def system_blocks(self) -> list[dict[str, Any]]:
        return [
            {"type": "text", "text": _content_text(m.get("content"))}
            for m in self.all_messages
            if m.get("role") in ("system", "developer")
        ]

    @property
    def system_text(self) -> str:
        return "\n\n".join(str(b["text"]) for b in self.system_blocks)

    @property
    def messages(self) -> list[dict[str, Any]]:
        return [m for m in self.all_messages if m.get("role") not in ("system", "developer")]

    @property
    def user_text(self) -> str:
        return "\n".join(
            _content_text(m.get("content")) for m in self.messages if m.get("role") == "user"
        )

    @property
    def last_user_text(self) -> str:
        users = [m for m in self.messages if m.get("role") == "user"]
        return _content_text(users[-1].get("content")) if users else ""

    @property
    def images(self) -> list[tuple[str, bytes]]:
        """(media type, bytes) of every well-formed image part, in order."""
        found: list[tuple[str, bytes]] = []
        for _, _, url in _image_urls(self.body):
            parsed = _data_url(url)
            if parsed is not None:
                found.append(parsed)
        return found

    @property
    def tools(self) -> list[dict[str, Any]]:
        found: list[dict[str, Any]] = []
        for tool in self.body.get("tools") or []:
            function = tool.get("function") if isinstance(tool, dict) else None
            if isinstance(function, dict):
                found.append(
                    {
                        "name": function.get("name"),
                        "description": function.get("description", ""),
                        "input_schema": function.get("parameters") or {},
                    }
                )
        return found

    @property
    def structure(self) -> Structure | None:
        """How a JSON answer was asked for: the three levels of `providers.openai`."""
        if self.tools and self.body.get("tool_choice") != "none":
            return "tool"
        response_format = self.body.get("response_format")
        if isinstance(response_format, dict) and response_format.get("type") == "json_schema":
            return "response_format"
        if _embedded_request(self.system_text + "\n" + self.user_text) is not None:
            return "instruction"
        return None

    @property
    def tool_name(self) -> str | None:
        return self._asked()[0]

    @property
    def schema(self) -> dict[str, Any]:
        return self._asked()[1]

    def _asked(self) -> tuple[str | None, dict[str, Any]]:
        structure = self.structure
        if structure == "tool":
            choice = self.body.get("tool_choice")
            name = self.tools[0]["name"]
            if isinstance(choice, dict) and isinstance(choice.get("function"), dict):
                name = choice["function"].get("name")
            schema: dict[str, Any] = next(
                (t["input_schema"] for t in self.tools if t["name"] == name), {}
            )
            return str(name), schema
        if structure == "response_format":
            spec = self.body["response_format"].get("json_schema") or {}
            return str(spec.get("name")), dict(spec.get("schema") or {})
        if structure == "instruction":
            embedded = _embedded_request(self.system_text + "\n" + self.user_text)
            assert embedded is not None
            return embedded
        return None, {}

    def brain_view(self, *, as_chat: bool = False) -> RecordedRequest:
        """The same request in Anthropic's shape, which is what `Brain` reads."""
        body: dict[str, Any] = {
            "system": self.system_text,
            "messages": [
                {"role": m.get("role"), "content": _content_text(m.get("content"))}
                for m in self.messages
                if m.get("role") in ("user", "assistant")
            ],
        }
        name, schema = self._asked()
        if name is not None and not as_chat:
            body["tools"] = [{"name": name, "input_schema": schema}]
            body["tool_choice"] = {"type": "tool", "name": name}
        return RecordedRequest(self.method, self.path, self.headers, body)


# --- the server --------------------------------------------------------------------------


class OpenAIFake:
    """`async with OpenAIFake() as server:` listens on 127.0.0.1 (ephemeral port).

    `api_key`: when set, requests must carry exactly this key (Bearer); when None any
    key or none is accepted. The behaviour switches are plain attributes, so a test can
    turn them on after start.
    """

    def __init__(
        self,
        *,
        api_key: str | None = None,
        latency: float = 0.0,
        ignores_tool_choice: bool = False,
        malformed_arguments: bool = False,
        rejects_tools: bool = False,
        supports_response_format: bool = True,
        rejects_max_tokens: bool = False,
        serves_model_lookup: bool = True,
        llama_cpp: bool = False,
    ) -> None:
        self.expected_api_key = api_key
        self.known_models: set[str] = set(KNOWN_MODELS)
        self.text_only_models: set[str] = set(TEXT_ONLY_MODELS)
        self.latency = latency
        # Pacing of streamed answers (0: as fast as the loop goes).
        self.first_token_seconds = 0.0
        self.tokens_per_second = 0.0
        self.ignores_tool_choice = ignores_tool_choice
        self.malformed_arguments = malformed_arguments
        self.rejects_tools = rejects_tools
        self.supports_response_format = supports_response_format
        self.rejects_max_tokens = rejects_max_tokens
        self.serves_model_lookup = serves_model_lookup
        self.llama_cpp = llama_cpp
        self.brain = Brain()
        self.requests: list[OpenAIRequest] = []
        # Every chat completion body sent back, in order (usage included).
        self.responses: list[dict[str, Any]] = []
        # When set to an unset Event, chat requests wait for it after being recorded, so
        # a test can hold requests in flight without relying on timing.
        self.gate: asyncio.Event | None = None
        self._arrived = asyncio.Event()
        self.in_flight = 0
        self.max_in_flight = 0
        self.base_url = ""
        self._script: deque[ScriptItem] = deque()
        # model -> canonical prompt (of at least CACHE_MIN_TOKENS) -> when it expires
        self._cached_prompts: dict[str, dict[str, float]] = {}
        self.clock = time.monotonic
        self._runner: web.AppRunner | None = None

    def enqueue(self, *items: ScriptItem) -> None:
        self._script.extend(items)

    @property
    def script_left(self) -> int:
        return len(self._script)

    @property
    def chat_requests(self) -> list[OpenAIRequest]:
        """The chat completion requests (not the Models API ones)."""
        return [r for r in self.requests if r.path.endswith("/chat/completions")]

    async def start(self) -> None:
        app = web.Application(client_max_size=32 * 1024 * 1024)
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/v1/models/{model_id:.+}", self._model)
        app.router.add_route("*", "/{tail:.*}", self._invalid_url)
        # handler_cancellation: a client that timed out and hung up stops its handler.
        self._runner = web.AppRunner(
            app, handler_cancellation=True, access_log=None, shutdown_timeout=0.5
        )
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", 0).start()
        host, port = self._runner.addresses[0][:2]
        self.base_url = f"http://{host}:{port}/v1"

    async def close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # --- handlers ----------------------------------------------------------------------

    def _record(self, request: web.Request, body: dict[str, Any]) -> OpenAIRequest:
        recorded = OpenAIRequest(
            method=request.method,
            path=request.path,
            headers={k.lower(): v for k, v in request.headers.items()},
            body=body,
        )
        self.requests.append(recorded)
        self._arrived.set()
        return recorded

    async def wait_for_requests(self, count: int) -> None:
        """Return once `count` requests have arrived (an event, not a timed poll)."""
        while len(self.requests) < count:
            self._arrived.clear()
            await self._arrived.wait()

    def _auth_error(self, recorded: OpenAIRequest) -> web.Response | None:
        if self.expected_api_key is None:
            return None
        key = recorded.api_key
        if not key:
            return _error(
                401,
                "You didn't provide an API key. You need to provide your API key in an "
                "Authorization header using Bearer auth (i.e. Authorization: Bearer YOUR_KEY).",
                "invalid_request_error",
            )
        if key != self.expected_api_key:
            shown = f"{key[:3]}{'*' * 4}{key[-4:]}" if len(key) > 8 else "*" * len(key)
            return _error(
                401,
                f"Incorrect API key provided: {shown}. You can find your API key at "
                "https://platform.openai.com/account/api-keys.",
                "invalid_request_error",
                code="invalid_api_key",
            )
        return None

    def _model_scripted(self) -> ScriptItem | None:
        """A Fault or Delay at the head of the script is meant for whichever call comes
        next, the Models API included; answers (Text, ToolUse) are left for chat."""
        if self._script and isinstance(self._script[0], Fault | Delay):
            return self._script.popleft()
        return None

    async def _models(self, request: web.Request) -> web.Response:
        recorded = self._record(request, {})
        denied = self._auth_error(recorded)
        if denied is not None:
            return denied
        return web.json_response(
            {"object": "list", "data": [_model_object(m) for m in sorted(self.known_models)]},
            headers=_headers(),
        )

    async def _model(self, request: web.Request) -> web.Response:
        recorded = self._record(request, {})
        denied = self._auth_error(recorded)
        if denied is not None:
            return denied
        item = self._model_scripted()
        if isinstance(item, Delay):
            await asyncio.sleep(item.seconds)
            item = item.then
        if isinstance(item, Fault):
            return _fault(item)
        if self.llama_cpp:
            error = {"message": "File Not Found", "type": "not_found_error", "code": 404}
            return web.json_response({"error": error}, status=404)
        if not self.serves_model_lookup:
            return web.json_response({"detail": "Not Found"}, status=404)
        model_id = unquote(request.match_info["model_id"])
        if model_id not in self.known_models:
            return _error(
                404,
                f"The model '{model_id}' does not exist",
                "invalid_request_error",
                param="model",
                code="model_not_found",
            )
        return web.json_response(_model_object(model_id), headers=_headers())

    async def _invalid_url(self, request: web.Request) -> web.Response:
        self._record(request, {})
        return _error(
            404, f"Invalid URL ({request.method} {request.path})", "invalid_request_error"
        )

    async def _chat(self, request: web.Request) -> web.StreamResponse:
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
        recorded = self._record(request, body if isinstance(body, dict) else {})
        if self.gate is not None:
            await self.gate.wait()
        if self.latency:
            await asyncio.sleep(self.latency)

        denied = self._auth_error(recorded)
        if denied is not None:
            return denied
        if not isinstance(body, dict):
            return _error(
                400,
                "We could not parse the JSON body of your request. (HINT: This likely means "
                "you aren't using your HTTP library correctly. The OpenAI API expects a JSON "
                "payload, but what was sent was not valid JSON.)",
                "invalid_request_error",
            )
        problem = _invalid(body, llama_cpp=self.llama_cpp)
        if problem is not None:
            return _error(
                400, problem[0], "invalid_request_error", param=problem[1], code=problem[2]
            )
        model = body["model"]
        if model not in self.known_models:
            return _error(
                404,
                f"The model `{model}` does not exist or you do not have access to it.",
                "invalid_request_error",
                code="model_not_found",
            )
        blind = self._blind(body)
        if blind is not None:
            return blind
        lacking = self._lacking(body)
        if lacking is not None:
            return lacking
        if body.get("stream_options") is not None and body.get("stream") is not True:
            return _error(
                400,
                "The 'stream_options' parameter is only allowed when 'stream' is enabled.",
                "invalid_request_error",
                param="stream_options",
            )

        item = self._script.popleft() if self._script else None
        if isinstance(item, Delay):
            await asyncio.sleep(item.seconds)
            item = item.then
        if item is None:
            item = self.brain.answer(recorded.brain_view())
        if isinstance(item, Fault):
            return _fault(item)
        if body.get("stream") is True:
            return await self._stream(request, recorded, item)
        if isinstance(item, Broken):
            return _fault(Fault(503))  # without a stream there is nothing to break part-way
        completion = self._completion(recorded, item)
        self.responses.append(completion)
        return web.json_response(completion, headers=_headers())

    def _blind(self, body: dict[str, Any]) -> web.Response | None:
        """OpenAI's 400 for an image sent to a model that reads none."""
        if body["model"] not in self.text_only_models:
            return None
        for i, j, _ in _image_urls(body):
            return _error(
                400,
                "Invalid content type. image_url is only supported by certain models.",
                "invalid_request_error",
                param=f"messages.[{i}].content.[{j}].type",
            )
        return None

    def _lacking(self, body: dict[str, Any]) -> web.Response | None:
        """The 400s of a server that lacks a feature the request uses."""
        model = body["model"]
        if self.rejects_max_tokens and "max_tokens" in body:
            return _error(
                400,
                "Unsupported parameter: 'max_tokens' is not supported with this model. "
                "Use 'max_completion_tokens' instead.",
                "invalid_request_error",
                param="max_tokens",
                code="unsupported_parameter",
            )
        if self.rejects_tools and body.get("tools"):
            return _error(400, f"{model} does not support tools", "invalid_request_error")
        response_format = body.get("response_format")
        if (
            not self.supports_response_format
            and isinstance(response_format, dict)
            and response_format.get("type") != "text"
        ):
            kind = response_format.get("type")
            return _error(
                400,
                f"Invalid parameter: 'response_format' of type '{kind}' is not supported "
                "with this model.",
                "invalid_request_error",
                param="response_format",
            )
        return None

    # --- answers -----------------------------------------------------------------------

    def _completion(self, request: OpenAIRequest, item: Text | ToolUse) -> dict[str, Any]:
        message: dict[str, Any] = {
            "role": "assistant",
            "content": None,
            "refusal": None,
            "annotations": [],
        }
        finish = "stop"
        overrides: dict[str, int | None] = {}
        structure = request.structure
        if isinstance(item, Text):
            parts = [item.text] if isinstance(item.text, str) else list(item.text)
            message["content"] = "".join(parts)
            overrides = dict(item.usage or {})
        elif structure == "tool" and (self.ignores_tool_choice or self._reads_as_auto(request)):
            chat = self.brain.answer(request.brain_view(as_chat=True))
            message["content"] = chat.text if isinstance(chat, Text) else ""
        elif structure == "tool":
            arguments = json.dumps(item.input)
            if self.malformed_arguments:
                arguments = arguments[:-1]  # cut short, as a model out of patience does
            message["tool_calls"] = [
                {
                    "id": "call_" + uuid.uuid4().hex[:24],
                    "type": "function",
                    "function": {"name": request.tool_name, "arguments": arguments},
                }
            ]
            finish = "tool_calls"
        elif structure == "instruction":
            message["content"] = (
                "Here is the JSON you asked for:\n```json\n"
                + json.dumps(item.input, indent=2)
                + "\n```"
            )
        else:
            message["content"] = json.dumps(item.input)
        if _cut_to_limit(message, request.body):
            finish = "length"
        output = message["content"] or json.dumps(message.get("tool_calls"))
        return {
            "id": "chatcmpl-" + uuid.uuid4().hex[:24],
            "object": "chat.completion",
            "created": int(time.time()),
            "model": request.body["model"],
            "choices": [
                {"index": 0, "message": message, "logprobs": None, "finish_reason": finish}
            ],
            "usage": self._usage(request, output, overrides),
            "service_tier": "default",
            "system_fingerprint": "fp_fake",
        }

    def _reads_as_auto(self, request: OpenAIRequest) -> bool:
        """llama.cpp reads a `tool_choice` that is not a string as "auto" (and a model
        left to choose answers this fake's chat in prose)."""
        choice = request.body.get("tool_choice")
        return self.llama_cpp and choice is not None and not isinstance(choice, str)

    async def _stream(
        self, request: web.Request, recorded: OpenAIRequest, item: Text | ToolUse | Broken
    ) -> web.StreamResponse:
        """The answer as OpenAI streams it: `chat.completion.chunk` events, a last chunk
        with the usage when `stream_options.include_usage`, then `[DONE]`. A `Broken`
        item sends OpenAI's mid-stream `{"error": ...}` event or drops the connection."""
        if isinstance(item, ToolUse):
            return _error(400, "the fake streams text answers only", "invalid_request_error")
        text = Text(item.text) if isinstance(item, Broken) else item
        completion = self._completion(recorded, text)
        self.responses.append(completion)
        full = completion["choices"][0]["message"]["content"] or ""
        options = recorded.body.get("stream_options")
        with_usage = isinstance(options, dict) and options.get("include_usage") is True
        response = web.StreamResponse(
            headers=_headers({"content-type": "text/event-stream; charset=utf-8"})
        )
        await response.prepare(request)
        base = {
            "id": completion["id"],
            "object": "chat.completion.chunk",
            "created": completion["created"],
            "model": completion["model"],
            "service_tier": "default",
            "system_fingerprint": "fp_fake",
        }

        async def send(choices: list[dict[str, Any]], usage: Any = None) -> None:
            chunk = {**base, "choices": choices}
            if with_usage:
                chunk["usage"] = usage
            await response.write(f"data: {json.dumps(chunk)}\n\n".encode())

        def choice(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
            return {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}

        await send([choice({"role": "assistant", "content": "", "refusal": None})])
        sent = 0
        for index, piece in enumerate(stream_pieces(full)):
            if isinstance(item, Broken) and sent >= item.after:
                if item.how == "drop":
                    assert request.transport is not None
                    request.transport.close()
                    return response
                error = {
                    "message": "The server had an error while processing your request.",
                    "type": "server_error",
                    "param": None,
                    "code": None,
                }
                await response.write(f"data: {json.dumps({'error': error})}\n\n".encode())
                await response.write_eof()
                return response
            await pace(index, self.first_token_seconds, self.tokens_per_second)
            await send([choice({"content": piece})])
            sent += len(piece)
        await send([choice({}, completion["choices"][0]["finish_reason"])])
        if with_usage:
            await send([], completion["usage"])
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response

    def _usage(
        self, request: OpenAIRequest, output: str, overrides: Mapping[str, int | None]
    ) -> dict[str, Any]:
        canonical = _canonical(request.body)
        prompt = max(_tokens(canonical), 1)
        retention = CACHE_TTL_SECONDS.get(str(request.body.get("prompt_cache_retention")))
        cached = self._cached_tokens(
            str(request.body["model"]), canonical, prompt, retention or CACHE_TTL_SECONDS[None]
        )
        completion = max(_tokens(output), 1)
        usage: dict[str, Any] = {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": cached, "audio_tokens": 0},
            "completion_tokens_details": {
                "reasoning_tokens": 0,
                "audio_tokens": 0,
                "accepted_prediction_tokens": 0,
                "rejected_prediction_tokens": 0,
            },
        }
        for key, value in overrides.items():
            if key == "cached_tokens":
                if isinstance(usage["prompt_tokens_details"], dict):
                    usage["prompt_tokens_details"]["cached_tokens"] = value
            else:
                usage[key] = value
        return usage

    def _cached_tokens(self, model: str, canonical: str, prompt_tokens: int, ttl: float) -> int:
        """OpenAI's rule: 0 under 1,024 tokens, else the longest prefix shared with an
        earlier prompt to this model that has not expired, in whole 128-token steps
        from 1,024. The prompts that served the hit, and this one, live on."""
        if prompt_tokens < CACHE_MIN_TOKENS:
            return 0
        now = self.clock()
        alive = {
            before: expires
            for before, expires in self._cached_prompts.get(model, {}).items()
            if expires > now
        }
        overlap = {before: _shared_prefix(canonical, before) for before in alive}
        tokens = max(overlap.values(), default=0) // 4  # tokens wholly inside the prefix
        cached = 0
        if tokens >= CACHE_MIN_TOKENS:
            cached = CACHE_MIN_TOKENS + (tokens - CACHE_MIN_TOKENS) // CACHE_STEP * CACHE_STEP
            for before, chars in overlap.items():
                if chars // 4 >= cached:  # a hit keeps what served it alive
                    alive[before] = max(alive[before], now + ttl)
        alive[canonical] = max(alive.get(canonical, 0.0), now + ttl)
        self._cached_prompts[model] = alive
        return cached


def _cut_to_limit(message: dict[str, Any], body: Mapping[str, Any]) -> bool:
    """Cut the answer at the request's token limit (4 characters a token); True if cut."""
    limit = body.get("max_completion_tokens") or body.get("max_tokens")
    if not isinstance(limit, int):
        return False
    most = limit * 4
    calls = message.get("tool_calls")
    if calls:
        arguments = calls[0]["function"]["arguments"]
        if _tokens(arguments) <= limit:
            return False
        calls[0]["function"]["arguments"] = arguments[:most]
        return True
    content = message.get("content")
    if not isinstance(content, str) or _tokens(content) <= limit:
        return False
    message["content"] = content[:most]
    return True


def _canonical(body: Mapping[str, Any]) -> str:
    """What the fake counts and caches: tools, response format, then messages in order."""
    parts = [
        json.dumps(tool, sort_keys=True, separators=(",", ":")) for tool in body.get("tools") or []
    ]
    if isinstance(body.get("response_format"), dict):
        parts.append(json.dumps(body["response_format"], sort_keys=True, separators=(",", ":")))
    for message in body.get("messages") or []:
        text = _canonical_content(message.get("content"))
        calls = message.get("tool_calls")
        if calls:
            text += json.dumps(calls, sort_keys=True, separators=(",", ":"))
        parts.append(f"<|{message.get('role')}|>{text}")
    return "\n".join(parts)


def _canonical_content(content: Any) -> str:
    """A message's content as the fake counts it: text as it is, each image as a mark
    unique to its bytes and as long as its tokens (4 characters a token)."""
    if not isinstance(content, list):
        return _content_text(content)
    pieces: list[str] = []
    for part in content:
        if not isinstance(part, dict):
            continue
        if part.get("type") == "image_url":
            parsed = _data_url(str((part.get("image_url") or {}).get("url", "")))
            if parsed is not None:
                _, width, height = image_facts(parsed[1])
                mark = f"<image {hashlib.sha256(parsed[1]).hexdigest()}>"
                pieces.append(mark.ljust(4 * image_tokens(width, height), "."))
        else:
            pieces.append(str(part.get("text", "")))
    return "\n".join(pieces)


def image_tokens(width: int, height: int) -> int:
    """OpenAI's count for a high-detail image: fit in 2048 pixels, shortest side to
    768, then 170 tokens per 512-pixel tile and 85 more."""
    fit = min(1.0, 2048 / max(width, height, 1))
    shrink = min(1.0, 768 / max(min(width, height) * fit, 1))
    wide, high = width * fit * shrink, height * fit * shrink
    return 85 + 170 * math.ceil(wide / 512) * math.ceil(high / 512)


def _image_urls(body: Mapping[str, Any]) -> list[tuple[int, int, str]]:
    """(message index, part index, url) of every `image_url` part of the request."""
    found: list[tuple[int, int, str]] = []
    for i, message in enumerate(body.get("messages") or []):
        content = message.get("content") if isinstance(message, dict) else None
        for j, part in enumerate(content if isinstance(content, list) else []):
            if isinstance(part, dict) and part.get("type") == "image_url":
                image_url = part.get("image_url")
                url = image_url.get("url") if isinstance(image_url, dict) else None
                found.append((i, j, str(url or "")))
    return found


def _data_url(url: str) -> tuple[str, bytes] | None:
    """(MIME type, bytes) of a well-formed base64 image data URL, else None."""
    match = _DATA_URL.fullmatch(url)
    if match is None or "base64" not in match.group(2).split(";"):
        return None
    try:
        return match.group(1), base64.b64decode(match.group(3), validate=True)
    except ValueError:
        return None


def _invalid_choice(value: object, param: str, allowed: tuple[str, ...]) -> Problem | None:
    """A required field that must be one of `allowed`."""
    if value is None:
        return _missing(param)
    return None if value in allowed else _bad_value(param, value, allowed)


def _invalid_parts(where: str, role: str, content: list[Any]) -> Problem | None:
    """The content parts of one message: their types, and each image as OpenAI checks it."""
    allowed = _PART_TYPES.get(role, ("text",))
    for j, part in enumerate(content):
        at = f"{where}.content[{j}]"
        if not isinstance(part, dict):
            return _wrong_type(at, "an object", part)
        kind = part.get("type")
        problem = _invalid_choice(kind, f"{at}.type", allowed)
        if problem is not None:
            return problem
        if kind == "text" and not isinstance(part.get("text"), str):
            return _missing(f"{at}.text")
        if kind == "image_url":
            problem = _invalid_image(f"{at}.image_url", part.get("image_url"))
            if problem is not None:
                return problem
    return None


def _invalid_image(at: str, image_url: object) -> Problem | None:
    if not isinstance(image_url, dict) or not isinstance(image_url.get("url"), str):
        return _missing(f"{at}.url")
    detail = image_url.get("detail")
    if detail is not None and detail not in ("auto", "low", "high"):
        return _bad_value(f"{at}.detail", detail, ("auto", "low", "high"))
    url: str = image_url["url"]
    expected = (
        f"Invalid '{at}.url'. Expected a base64-encoded data URL with an image MIME type "
        "(e.g. 'data:image/png;base64,aW1nIGJ5dGVzIGhlcmU='), but got "
    )
    match = _DATA_URL.fullmatch(url)
    if match is None:
        # The real API would fetch an http(s) URL; the fake fetches nothing.
        return f"{expected}a value that is not a data URL.", f"{at}.url", "invalid_value"
    if "base64" not in match.group(2).split(";"):
        return f"{expected}a value without the ';base64' separator.", f"{at}.url", "invalid_value"
    if not match.group(1).startswith("image/"):
        got = f"unsupported MIME type '{match.group(1)}'."
        return expected + got, f"{at}.url", "invalid_value"
    parsed = _data_url(url)
    if parsed is None or not parsed[1]:
        return f"{expected}an invalid base64-encoded value.", f"{at}.url", "invalid_value"
    actual, _, _ = image_facts(parsed[1])
    if actual is None or len(parsed[1]) > MAX_IMAGE_BYTES:
        return (
            "You uploaded an unsupported image. Please make sure your image is below 20 MB "
            "in size and is of one the following formats: ['png', 'jpeg', 'gif', 'webp'].",
            None,
            "invalid_image_format",
        )
    return None


def _shared_prefix(a: str, b: str) -> int:
    """Length of the longest common prefix (binary search over C-speed comparisons)."""
    low, high = 0, min(len(a), len(b))
    while low < high:
        mid = (low + high + 1) // 2
        if a[:mid] == b[:mid]:
            low = mid
        else:
            high = mid - 1
    return low


# --- validation ----------------------------------------------------------------------------

Problem = tuple[str, str | None, str | None]  # message, param, code


def _type_name(value: object) -> str:
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int):
        return "an integer"
    if isinstance(value, float):
        return "a decimal"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    if value is None:
        return "null"
    return "an object"


def _missing(param: str) -> Problem:
    return f"Missing required parameter: '{param}'.", param, "missing_required_parameter"


def _wrong_type(param: str, expected: str, value: object) -> Problem:
    return (
        f"Invalid type for '{param}': expected {expected}, but got {_type_name(value)} instead.",
        param,
        "invalid_type",
    )


def _bad_value(param: str, value: object, allowed: tuple[str, ...]) -> Problem:
    quoted = [f"'{a}'" for a in allowed]
    listed = (
        ", ".join(quoted[:-1]) + f", and {quoted[-1]}" if len(quoted) > 2 else " and ".join(quoted)
    )
    return f"Invalid value: '{value}'. Supported values are: {listed}.", param, "invalid_value"


def _invalid(body: dict[str, Any], *, llama_cpp: bool = False) -> Problem | None:
    """The checks OpenAI makes that a client bug would trip (llama.cpp ignores fields
    it does not know, and takes any string `tool_choice` or none)."""
    unknown = sorted(set(body) - _PARAMETERS)
    if unknown and not llama_cpp:
        return f"Unrecognized request argument supplied: {unknown[0]}", None, None
    if not isinstance(body.get("model"), str) or not body["model"]:
        return "you must provide a model parameter", None, None
    stream = body.get("stream")
    if stream is not None and not isinstance(stream, bool):
        return _wrong_type("stream", "boolean", stream)
    problem = _invalid_messages(body.get("messages"))
    if problem is None:
        for param in ("max_tokens", "max_completion_tokens"):
            problem = problem or _invalid_limit(body, param)
    problem = problem or _invalid_tools(body)
    return problem or _invalid_response_format(body)


def _invalid_messages(messages: object) -> Problem | None:
    if messages is None:
        return _missing("messages")
    if not isinstance(messages, list):
        return _wrong_type("messages", "an array of objects", messages)
    if not messages:
        return (
            "Invalid 'messages': empty array. Expected an array with minimum length 1, "
            "but got an empty array instead.",
            "messages",
            "empty_array",
        )
    for i, message in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(message, dict):
            return _wrong_type(where, "an object", message)
        role = message.get("role")
        problem = _invalid_choice(role, f"{where}.role", _ROLES)
        if problem is not None:
            return problem
        content = message.get("content")
        if content is None:
            if role == "assistant" and message.get("tool_calls"):
                continue
            return _missing(f"{where}.content")
        if not isinstance(content, str | list):
            return _wrong_type(f"{where}.content", "one of a string or array of objects", content)
        if isinstance(content, list):
            problem = _invalid_parts(where, str(role), content)
            if problem is not None:
                return problem
        if role == "tool" and not message.get("tool_call_id"):
            return _missing(f"{where}.tool_call_id")
    images = len(_image_urls({"messages": messages}))
    if images > MAX_IMAGES:
        return (
            f"Invalid 'messages': too many images ({images}); at most {MAX_IMAGES} are allowed.",
            "messages",
            "invalid_value",
        )
    return None


def _invalid_limit(body: dict[str, Any], param: str) -> Problem | None:
    if param not in body or body[param] is None:
        return None
    value = body[param]
    if not isinstance(value, int) or isinstance(value, bool):
        return _wrong_type(param, "an integer", value)
    if value < 1:
        return (
            f"Invalid '{param}': integer below minimum value. Expected a value >= 1, "
            f"but got {value} instead.",
            param,
            "integer_below_min_value",
        )
    return None


def _invalid_schema(schema: object, where: str, owner: str) -> Problem | None:
    if not isinstance(schema, dict):
        return _wrong_type(where, "an object", schema)
    if schema.get("type") != "object":
        return (
            f"Invalid schema for {owner}: schema must be a JSON Schema of 'type: \"object\"', "
            f"got 'type: \"{schema.get('type')}\"'.",
            where,
            "invalid_function_parameters" if "function" in owner else "invalid_json_schema",
        )
    return None


def _invalid_tools(body: dict[str, Any]) -> Problem | None:
    tools = body.get("tools")
    names: list[str] = []
    if tools is not None:
        if not isinstance(tools, list):
            return _wrong_type("tools", "an array of objects", tools)
        if not tools:
            return (
                "Invalid 'tools': empty array. Expected an array with minimum length 1, "
                "but got an empty array instead.",
                "tools",
                "empty_array",
            )
        for i, tool in enumerate(tools):
            where = f"tools[{i}]"
            if not isinstance(tool, dict):
                return _wrong_type(where, "an object", tool)
            if tool.get("type") != "function":
                return _bad_value(f"{where}.type", tool.get("type"), ("function", "custom"))
            function = tool.get("function")
            if not isinstance(function, dict):
                return _missing(f"{where}.function")
            name = function.get("name")
            if not isinstance(name, str):
                return _missing(f"{where}.function.name")
            if not _NAME.match(name):
                return (
                    f"Invalid '{where}.function.name': string does not match pattern. "
                    "Expected a string that matches the pattern '^[a-zA-Z0-9_-]+$'.",
                    f"{where}.function.name",
                    "invalid_value",
                )
            if "parameters" in function:
                problem = _invalid_schema(
                    function["parameters"], f"{where}.function.parameters", f"function '{name}'"
                )
                if problem:
                    return problem
            names.append(name)
    choice = body.get("tool_choice")
    if choice is None:
        return None
    if tools is None:
        return (
            "Invalid value for 'tool_choice': 'tool_choice' is only allowed when 'tools' "
            "are specified.",
            "tool_choice",
            None,
        )
    if isinstance(choice, str):
        if choice not in ("none", "auto", "required"):
            return _bad_value("tool_choice", choice, ("none", "auto", "required"))
        return None
    if not isinstance(choice, dict):
        return _wrong_type("tool_choice", "one of a string or an object", choice)
    if choice.get("type") != "function":
        return _bad_value("tool_choice.type", choice.get("type"), ("function",))
    function = choice.get("function")
    if not isinstance(function, dict) or not isinstance(function.get("name"), str):
        return _missing("tool_choice.function.name")
    if function["name"] not in names:
        return (
            f"Invalid value for 'tool_choice': function '{function['name']}' not found in 'tools'.",
            "tool_choice",
            None,
        )
    return None


def _invalid_response_format(body: dict[str, Any]) -> Problem | None:
    response_format = body.get("response_format")
    if response_format is None:
        return None
    if not isinstance(response_format, dict):
        return _wrong_type("response_format", "an object", response_format)
    kind = response_format.get("type")
    if kind is None:
        return _missing("response_format.type")
    if kind not in ("text", "json_object", "json_schema"):
        return _bad_value("response_format.type", kind, ("text", "json_object", "json_schema"))
    if kind == "json_object":
        text = json.dumps(body.get("messages")).lower()
        if "json" not in text:
            return (
                "'messages' must contain the word 'json' in some form, to use "
                "'response_format' of type 'json_object'.",
                "messages",
                None,
            )
    if kind != "json_schema":
        return None
    spec = response_format.get("json_schema")
    if not isinstance(spec, dict):
        return _missing("response_format.json_schema")
    name = spec.get("name")
    if not isinstance(name, str):
        return _missing("response_format.json_schema.name")
    if not _NAME.match(name):
        return (
            "Invalid 'response_format.json_schema.name': string does not match pattern. "
            "Expected a string that matches the pattern '^[a-zA-Z0-9_-]+$'.",
            "response_format.json_schema.name",
            "invalid_value",
        )
    if "schema" in spec:
        problem = _invalid_schema(
            spec["schema"], "response_format.json_schema.schema", f"response_format '{name}'"
        )
        if problem:
            return problem
        if spec.get("strict"):
            return _not_strict(spec["schema"], name)
    return None


def _not_strict(schema: dict[str, Any], name: str, path: str = "()") -> Problem | None:
    """Structured Outputs' strict mode: every object closed and every property required."""
    if schema.get("type") == "object":
        props = schema.get("properties") or {}
        if schema.get("additionalProperties") is not False:
            return (
                f"Invalid schema for response_format '{name}': In context={path}, "
                "'additionalProperties' is required to be supplied and to be false.",
                "response_format",
                "invalid_json_schema",
            )
        missing = sorted(set(props) - set(schema.get("required") or []))
        if missing:
            return (
                f"Invalid schema for response_format '{name}': In context={path}, 'required' "
                f"is required to be supplied and to be an array including every key in "
                f"properties. Missing '{missing[0]}'.",
                "response_format",
                "invalid_json_schema",
            )
        for key, prop in props.items():
            if isinstance(prop, dict):
                problem = _not_strict(prop, name, f"('properties', '{key}')")
                if problem:
                    return problem
    items = schema.get("items")
    if isinstance(items, dict):
        return _not_strict(items, name, f"{path}, 'items'")
    return None


# --- responses -------------------------------------------------------------------------


def _headers(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    return {
        "x-request-id": "req_" + uuid.uuid4().hex[:24],
        "openai-version": "2020-10-01",
        **(extra or {}),
    }


def _model_object(model_id: str) -> dict[str, Any]:
    owner = "library" if ":" in model_id else "openai"
    return {"id": model_id, "object": "model", "created": 1_744_000_000, "owned_by": owner}


def _error(
    status: int,
    message: str,
    error_type: str,
    *,
    param: str | None = None,
    code: str | None = None,
    headers: Mapping[str, str] | None = None,
) -> web.Response:
    body = {"error": {"message": message, "type": error_type, "param": param, "code": code}}
    return web.json_response(body, status=status, headers=_headers(headers))


def _fault(fault: Fault) -> web.Response:
    headers: dict[str, str] = {}
    if fault.retry_after_ms is not None:
        # OpenAI sends seconds; Azure and the SDK also know milliseconds. Send both.
        headers["retry-after-ms"] = str(fault.retry_after_ms)
        headers["retry-after"] = str(math.ceil(fault.retry_after_ms / 1000))
    error_type, message = _FAULTS.get(
        fault.status, ("server_error" if fault.status >= 500 else "invalid_request_error", "")
    )
    message = message or f"Scripted fault {fault.status} from the fake server."
    code = {401: "invalid_api_key", 429: "rate_limit_exceeded"}.get(fault.status)
    return _error(fault.status, message, error_type, code=code, headers=headers)
