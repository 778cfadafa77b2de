"""`LLMClient` on the official OpenAI SDK (`openai.AsyncOpenAI`, Chat Completions).

Why Chat Completions and not the newer Responses API: it is the one dialect that
OpenAI, OpenRouter, Ollama, vLLM, LM Studio and llama.cpp all speak, so one client
serves the hosted vendor and a model on the operator's own machine alike.

What the SDK already does, and we only configure: retries of 408/409/429/5xx and
connection errors with backoff (honouring `retry-after-ms` / `retry-after`), and the
timeout. What this module adds:

* one semaphore per instance caps concurrent calls (the host shares ONE instance
  between all communities, as with `AnthropicLLM`);
* every SDK failure becomes `LLMError` with a short reason an operator can act on;
* an empty key works: local servers take none, so no `Authorization` header is sent;
* servers differ, so the forced tool call degrades step by step (forced function call,
  then `response_format` JSON schema, then JSON asked for in plain text) and each
  model remembers the first step that worked, across restarts when given a file
  (`providers.levels`); the call is forced as `tool_choice: "required"` with the one
  tool, the shape OpenAI, vLLM and llama.cpp all accept (llama.cpp's server takes only
  a string there and silently treats an object as "auto");
* an answer cut off at the token limit part-way through the JSON says nothing about
  the level, so it returns no input (the caller retries) instead of stepping down;
* each call asks for at most its role's output cap (`providers.OutputCap`), and each
  model's extra request fields (repetition controls such as `frequency_penalty`, or
  llama.cpp's `repeat_penalty`) go into every request to it through `extra_body`;
* newer OpenAI reasoning models refuse `max_tokens` and want `max_completion_tokens`;
  the first refusal switches that model over for good.

Cache hints (`SystemBlock.cache`, `ChatTurn.cache`) are ignored: OpenAI caches every
long enough prompt prefix by itself and reports the hits as `cached_tokens`.
"""

from __future__ import annotations

import asyncio
import base64
import functools
import json
import logging
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import openai
from openai import Omit
from openai.types import CompletionUsage
from openai.types.chat import (
    ChatCompletion,
    ChatCompletionAssistantMessageParam,
    ChatCompletionChunk,
    ChatCompletionContentPartImageParam,
    ChatCompletionContentPartParam,
    ChatCompletionContentPartTextParam,
    ChatCompletionFunctionToolParam,
    ChatCompletionMessageParam,
    ChatCompletionSystemMessageParam,
    ChatCompletionToolChoiceOptionParam,
    ChatCompletionUserMessageParam,
)
from openai.types.chat.chat_completion_message import ChatCompletionMessage
from openai.types.shared_params import FunctionDefinition, ResponseFormatJSONSchema

from providers import (
    DEFAULT_MODELS,
    HOSTED_TIMEOUT_SECONDS,
    OutputCap,
    capped,
    connection_failure,
    shared_tls_context,
)
from providers.levels import LevelMemory
from sonality.llm import (
    ChatTurn,
    ImagePart,
    LLMClient,
    LLMError,
    SystemBlock,
    TextResult,
    TextSink,
    ToolResult,
    Usage,
)

log = logging.getLogger(__name__)

OPENAI_API_URL = "https://api.openai.com/v1"

# Statuses the SDK retries by itself; failures with them have used up the retries.
_RETRIED_STATUSES = frozenset({408, 409, 429})
# How servers say "I do not support that parameter" (422 is what some local ones use).
_REJECTED_STATUSES = frozenset({400, 422})

Feature = Literal["tools", "response_format"]
_FEATURE_WORDS: dict[Feature, tuple[str, ...]] = {
    "tools": ("tool",),
    "response_format": ("response_format", "json_schema", "response format"),
}

#: The ways `call_tool` can get a JSON object out of a model, in the order tried.
TOOL_LEVELS: dict[int, str] = {
    1: "a forced function call",
    2: "response_format json_schema",
    3: "a JSON object asked for in plain text",
}


class _Unsupported(Exception):
    """The server refused a request because of a feature it lacks (not a client bug)."""


class OpenAILLM(LLMClient):
    """The `LLMClient` for OpenAI and OpenAI-compatible servers: one instance per process."""

    def __init__(
        self,
        *,
        api_key: str | None = None,
        base_url: str | None = None,
        default_model: str = DEFAULT_MODELS["openai"][0],
        max_retries: int = 3,
        timeout: float = HOSTED_TIMEOUT_SECONDS,
        max_concurrency: int = 8,
        output_cap: OutputCap | None = None,
        model_options: Mapping[str, Mapping[str, object]] | None = None,
        levels_file: Path | None = None,
    ) -> None:
        """`api_key`/`base_url` None fall back to the SDK's own environment lookup
        (`OPENAI_API_KEY`, `OPENAI_BASE_URL`). An empty or missing key is allowed:
        requests then carry no `Authorization` header at all (Ollama needs none, and a
        server that does need one answers 401, which is reported as such).

        `model_options`: extra request fields per model id (`"*"`: every other model),
        sent as they are. `levels_file`: where the structured-answer level of each model
        at this endpoint is kept across restarts (None: this process only)."""
        if max_concurrency < 1:
            raise ValueError("max_concurrency must be at least 1")
        self.default_model = default_model
        self._max_retries = max_retries
        self._timeout = timeout
        key = os.environ.get("OPENAI_API_KEY", "") if api_key is None else api_key
        self.has_key = bool(key.strip())
        self._client = openai.AsyncOpenAI(
            # The SDK will not build a client without some key; without a real one this
            # placeholder is never sent (the header is omitted, below).
            api_key=key if self.has_key else "no-key",
            base_url=base_url,
            max_retries=max_retries,
            timeout=timeout,
            # The SDK's aiohttp transport, as in `AnthropicLLM`: cheaper on the event loop.
            http_client=openai.DefaultAioHttpClient(verify=shared_tls_context()),
        )
        # The SDK's own way to send a request without credentials: omit the header
        # explicitly, per request (a client-wide default header does not count).
        self._headers: Mapping[str, str | Omit] | None = (
            None if self.has_key else {"Authorization": openai.omit}
        )
        self.base_url = str(self._client.base_url).rstrip("/")
        self._slots = asyncio.Semaphore(max_concurrency)
        self._output_cap = output_cap
        self._model_options = {k: dict(v) for k, v in (model_options or {}).items()}
        # Models that refused `max_tokens` and get `max_completion_tokens` instead.
        self._completion_token_models: set[str] = set()
        # Model -> the first level of TOOL_LEVELS that produced a JSON object for it.
        self._tool_levels = LevelMemory(self.base_url, levels_file)

    @property
    def endpoint(self) -> str:
        """How log lines and errors name the server: OpenAI itself or the configured URL."""
        if self.base_url == OPENAI_API_URL:
            return "the OpenAI API"
        return f"the OpenAI-compatible API at {self.base_url}"

    async def reply(
        self,
        *,
        system: Sequence[SystemBlock],
        messages: Sequence[ChatTurn],
        max_tokens: int,
        model: str | None = None,
        purpose: str = "reply",
        on_text: TextSink | None = None,
    ) -> TextResult:
        model = model or self.default_model
        max_tokens = capped(max_tokens, purpose, self._output_cap)
        if on_text is not None:
            return await self._stream_reply(
                purpose, model, _messages_param(system, messages), max_tokens, on_text
            )
        completion = await self._complete(
            purpose, model, _messages_param(system, messages), max_tokens
        )
        text = _first_message(completion, purpose, self.endpoint).content or ""
        return TextResult(text=text, model=completion.model, usage=_usage(completion.usage))

    async def call_tool(
        self,
        *,
        system: Sequence[SystemBlock],
        messages: Sequence[ChatTurn],
        tool: dict[str, Any],
        max_tokens: int,
        model: str | None = None,
        purpose: str = "tool",
    ) -> ToolResult:
        """Returns `{}` as the input when no level of TOOL_LEVELS got a JSON object out
        of the model, or its JSON was cut off at the token limit: the caller validates
        the input anyway and retries on invalid. The usage is the sum of every call made."""
        model = model or self.default_model
        max_tokens = capped(max_tokens, purpose, self._output_cap)
        first = self._first_level(model)
        usage = Usage()
        answered_by = model
        for level in range(first, len(TOOL_LEVELS) + 1):
            try:
                completion = await self._tool_attempt(
                    level, purpose, model, system, messages, tool, max_tokens
                )
            except _Unsupported as refused:
                log.info("%s: model %s refused %s: %s", purpose, model, TOOL_LEVELS[level], refused)
                continue
            except LLMError as err:  # the levels before answered, and were paid for
                if usage != Usage():
                    err.spent = TextResult(text="", model=answered_by, usage=usage)
                raise
            usage += _usage(completion.usage)
            answered_by = completion.model
            tool_input = _tool_input(completion, level, str(tool["name"]))
            if tool_input is not None:
                self._remember_level(model, level)
                return ToolResult(tool_input=tool_input, model=answered_by, usage=usage)
            if _cut_off(completion, level, str(tool["name"])):
                log.info(
                    "%s: model %s reached the limit of %d tokens inside its JSON through %s",
                    purpose,
                    model,
                    max_tokens,
                    TOOL_LEVELS[level],
                )
                return ToolResult(tool_input={}, model=answered_by, usage=usage)
            log.info(
                "%s: model %s gave no JSON object through %s", purpose, model, TOOL_LEVELS[level]
            )
        log.info(
            "%s: model %s gave no JSON object for tool %s in any of %d ways",
            purpose,
            model,
            tool["name"],
            len(TOOL_LEVELS) - first + 1,
        )
        return ToolResult(tool_input={}, model=answered_by, usage=usage)

    async def check_model(self, model: str) -> None:
        """One cheap request that fails the way a misconfiguration would.

        `GET /models/{model}` first; a server without that endpoint (a 404 that is not
        about the model) gets a 1-token chat call instead. Raises the SDK's own errors
        unchanged (`openai.AuthenticationError`, `openai.NotFoundError`,
        `openai.APIConnectionError`, ...), so the caller can tell a rejected key from an
        unknown model from an outage.
        """
        try:
            await self._client.models.retrieve(model, extra_headers=self._headers)
            return
        except openai.NotFoundError as err:
            if _is_unknown_model(err, model):
                raise
            log.info(
                "%s has no model lookup; checking %s with a 1-token call", self.endpoint, model
            )
        async with self._slots:
            await self._create(model, [{"role": "user", "content": "ping"}], 1)

    async def aclose(self) -> None:
        """Close the SDK's HTTP connection pool (call once at shutdown)."""
        await self._client.close()

    # --- calls ---------------------------------------------------------------------------

    async def _tool_attempt(
        self,
        level: int,
        purpose: str,
        model: str,
        system: Sequence[SystemBlock],
        messages: Sequence[ChatTurn],
        tool: dict[str, Any],
        max_tokens: int,
    ) -> ChatCompletion:
        name = str(tool["name"])
        schema: dict[str, object] = dict(tool.get("input_schema") or {"type": "object"})
        description = str(tool.get("description") or "")
        if level == 1:
            function: FunctionDefinition = {"name": name, "parameters": schema}
            if description:
                function["description"] = description
            tool_param: ChatCompletionFunctionToolParam = {"type": "function", "function": function}
            return await self._complete(
                purpose,
                model,
                _messages_param(system, messages),
                max_tokens,
                feature="tools",
                tools=[tool_param],
                # With one tool, "required" forces that tool, and every server takes it.
                tool_choice="required",
            )
        if level == 2:
            response_format: ResponseFormatJSONSchema = {
                "type": "json_schema",
                "json_schema": {"name": name, "schema": schema},
            }
            if description:
                response_format["json_schema"]["description"] = description
            return await self._complete(
                purpose,
                model,
                _messages_param(system, messages),
                max_tokens,
                feature="response_format",
                response_format=response_format,
            )
        instruction = SystemBlock(text=json_instruction(name, description, schema))
        return await self._complete(
            purpose, model, _messages_param([*system, instruction], messages), max_tokens
        )

    async def _complete(
        self,
        purpose: str,
        model: str,
        messages: list[ChatCompletionMessageParam],
        max_tokens: int,
        *,
        feature: Feature | None = None,
        tools: list[ChatCompletionFunctionToolParam] | Omit = openai.omit,
        tool_choice: ChatCompletionToolChoiceOptionParam | Omit = openai.omit,
        response_format: ResponseFormatJSONSchema | Omit = openai.omit,
    ) -> ChatCompletion:
        """One chat completion inside a concurrency slot; SDK errors become LLMError,
        except a refusal of `feature`, which becomes `_Unsupported`."""
        async with self._slots:
            try:
                return await self._create(
                    model,
                    messages,
                    max_tokens,
                    tools=tools,
                    tool_choice=tool_choice,
                    response_format=response_format,
                )
            except openai.OpenAIError as err:
                if feature is not None and _refuses(err, feature):
                    raise _Unsupported(_api_message(err)) from err
                reason = self._describe(err)
                request_id = getattr(err, "request_id", None)
                log.warning(
                    "OpenAI %s call (model %s) failed: %s%s",
                    purpose,
                    model,
                    reason,
                    f" [request {request_id}]" if request_id else "",
                )
                raise LLMError(reason, retry_after=_retry_after(err)) from err

    async def _create(
        self,
        model: str,
        messages: list[ChatCompletionMessageParam],
        max_tokens: int,
        *,
        tools: list[ChatCompletionFunctionToolParam] | Omit = openai.omit,
        tool_choice: ChatCompletionToolChoiceOptionParam | Omit = openai.omit,
        response_format: ResponseFormatJSONSchema | Omit = openai.omit,
    ) -> ChatCompletion:
        completion: ChatCompletion = await self._send(
            model,
            messages,
            max_tokens,
            tools=tools,
            tool_choice=tool_choice,
            response_format=response_format,
        )
        return completion

    async def _send(
        self, model: str, messages: list[ChatCompletionMessageParam], max_tokens: int, **fields: Any
    ) -> Any:
        """The SDK call, sending the token limit under the name the model accepts: a
        model that refuses `max_tokens` is asked once more with `max_completion_tokens`,
        and keeps that from then on."""
        create = functools.partial(
            self._client.chat.completions.create,
            model=model,
            messages=messages,
            extra_headers=self._headers,
            extra_body=self._options(model),
            **fields,
        )
        if model not in self._completion_token_models:
            try:
                return await create(max_tokens=max_tokens)
            except openai.APIStatusError as err:
                if not _wants_max_completion_tokens(err):
                    raise
            log.info("model %s takes max_completion_tokens instead of max_tokens", model)
            self._completion_token_models.add(model)
        return await create(max_completion_tokens=max_tokens)

    async def _stream_reply(
        self,
        purpose: str,
        model: str,
        messages: list[ChatCompletionMessageParam],
        max_tokens: int,
        on_text: TextSink,
    ) -> TextResult:
        """A streamed chat completion: each content delta goes to `on_text` as it comes.

        `include_usage` asks for the final usage chunk (servers that ignore it leave the
        usage at zero). A stream counts only when a choice finished: an `error` chunk
        part-way, a dropped connection or an end without `finish_reason` raises
        `LLMError`. Errors raised by the sink itself pass through unchanged.
        """
        parts: list[str] = []
        delivered = 0
        finished = False
        answered_by = model
        usage = Usage()
        async with self._slots:
            try:
                stream = await self._open_stream(model, messages, max_tokens)
                async with stream:
                    async for chunk in stream:
                        answered_by = chunk.model or answered_by
                        if chunk.usage is not None:
                            usage = _usage(chunk.usage)
                        for choice in chunk.choices:
                            if choice.index != 0:
                                continue
                            piece = choice.delta.content if choice.delta is not None else None
                            if piece:
                                parts.append(piece)
                                delivered += len(piece)
                                try:
                                    await on_text(piece)
                                except Exception as err:
                                    raise _SinkFailed(err) from err
                            if choice.finish_reason is not None:
                                finished = True
            except _SinkFailed as failed:
                raise failed.error from None
            except openai.OpenAIError as err:
                # An `error` chunk part-way arrives as the bare `APIError`.
                if delivered or type(err) is openai.APIError:
                    why = _api_message(err)
                    raise LLMError(self._broken(purpose, model, delivered, why)) from err
                reason = self._describe(err)
                log.warning("OpenAI %s stream (model %s) failed: %s", purpose, model, reason)
                raise LLMError(reason, retry_after=_retry_after(err)) from err
            except Exception as err:  # the transport's own error when the connection drops
                why = f"{type(err).__name__}: {str(err)[:200]}"
                raise LLMError(self._broken(purpose, model, delivered, why)) from err
        if not finished:
            raise LLMError(self._broken(purpose, model, delivered, "it ended early"))
        return TextResult(text="".join(parts), model=answered_by, usage=usage)

    async def _open_stream(
        self, model: str, messages: list[ChatCompletionMessageParam], max_tokens: int
    ) -> openai.AsyncStream[ChatCompletionChunk]:
        stream: openai.AsyncStream[ChatCompletionChunk] = await self._send(
            model, messages, max_tokens, stream=True, stream_options={"include_usage": True}
        )
        return stream

    def _broken(self, purpose: str, model: str, delivered: int, why: str) -> str:
        reason = f"the reply stream from {self.endpoint} broke after {delivered} characters ({why})"
        log.warning("OpenAI %s stream (model %s): %s", purpose, model, reason)
        return reason

    def _options(self, model: str) -> dict[str, object] | None:
        """The extra request fields configured for `model` (None: nothing to add)."""
        options = self._model_options.get(model, self._model_options.get("*"))
        return dict(options) if options else None

    def _first_level(self, model: str) -> int:
        remembered = self._tool_levels.get(model)
        return remembered if remembered in TOOL_LEVELS else 1

    def _remember_level(self, model: str, level: int) -> None:
        if self._tool_levels.get(model) == level:
            return
        self._tool_levels.put(model, level)
        log.info(
            "model %s gives structured answers through %s (level %d of %d)",
            model,
            TOOL_LEVELS[level],
            level,
            len(TOOL_LEVELS),
        )

    def _describe(self, err: openai.OpenAIError) -> str:
        """A one-line reason an operator can act on (key, model, quota, outage, network)."""
        retried = f" after {self._max_retries} retries" if self._max_retries else ""
        where = self.endpoint
        refused = connection_failure(err)
        if refused is not None:
            return f"could not connect to {where} ({refused}){retried}"
        if isinstance(err, openai.APITimeoutError):
            return f"{where} did not answer within {self._timeout:g}s (timeout){retried}"
        if isinstance(err, openai.APIConnectionError):
            return f"could not connect to {where} (connection error){retried}"
        if isinstance(err, openai.APIStatusError):
            status = err.status_code
            code = _error_field(err, "code")
            if status == 401:
                if not self.has_key:
                    return f"{where} wants an API key (401): set OPENAI_API_KEY"
                status_text = f"401 {code}" if code else "401"
                return f"the API key in OPENAI_API_KEY was rejected by {where} ({status_text})"
            if status == 403:
                return f"the API key in OPENAI_API_KEY may not do this at {where} (403)"
            if status == 404:
                return f"{where} does not know this model or path (404: {_api_message(err)})"
            if status == 429:
                if code == "insufficient_quota":
                    return f"{where} says the account is out of quota (429 insufficient_quota)"
                return f"rate limited by {where} (429){retried}"
            if status >= 500 or status in _RETRIED_STATUSES:
                return f"{where} failed with status {status}{retried}"
            return f"{where} rejected the request ({status}: {_api_message(err)})"
        return f"unexpected OpenAI SDK error: {type(err).__name__}: {str(err)[:200]}"


# --- request building ----------------------------------------------------------------------


def json_instruction(name: str, description: str, schema: Mapping[str, object]) -> str:
    """The last resort of `call_tool`: ask in words for the JSON the tool would get."""
    props = schema.get("properties")
    fields: list[str] = []
    if isinstance(props, Mapping):
        for key, prop in props.items():
            kind = prop.get("type", "any") if isinstance(prop, Mapping) else "any"
            choices = prop.get("enum") if isinstance(prop, Mapping) else None
            one_of = f", one of {', '.join(map(str, choices))}" if isinstance(choices, list) else ""
            fields.append(f"- {key} ({kind}{one_of})")
    purpose = f" ({description})" if description else ""
    return (
        f"Answer with only a JSON object: the input of the function `{name}`{purpose}, "
        "with these fields:\n"
        + "\n".join(fields)
        + "\nIt must match this JSON schema:\n"
        + json.dumps(schema, ensure_ascii=False)
        + "\nWrite nothing before or after the JSON object."
    )


def _messages_param(
    system: Sequence[SystemBlock], turns: Sequence[ChatTurn]
) -> list[ChatCompletionMessageParam]:
    params: list[ChatCompletionMessageParam] = []
    system_text = "\n\n".join(block.text for block in system if block.text)
    if system_text:
        params.append(ChatCompletionSystemMessageParam(role="system", content=system_text))
    for turn in turns:
        if turn.images:
            parts: list[ChatCompletionContentPartParam] = [
                *(_image_part(image) for image in turn.images),
                ChatCompletionContentPartTextParam(type="text", text=turn.content),
            ]
            params.append(ChatCompletionUserMessageParam(role="user", content=parts))
        elif turn.role == "user":
            params.append(ChatCompletionUserMessageParam(role="user", content=turn.content))
        else:
            params.append(
                ChatCompletionAssistantMessageParam(role="assistant", content=turn.content)
            )
    return params


def _image_part(image: ImagePart) -> ChatCompletionContentPartImageParam:
    """A picture inline as a data URL: the one image form OpenAI and the local servers
    (llama.cpp, Ollama, vLLM) all take, and no server is sent to fetch anything."""
    encoded = base64.standard_b64encode(image.data).decode("ascii")
    return ChatCompletionContentPartImageParam(
        type="image_url", image_url={"url": f"data:{image.media_type};base64,{encoded}"}
    )


# --- answer parsing ----------------------------------------------------------------------


def _first_message(completion: ChatCompletion, purpose: str, where: str) -> ChatCompletionMessage:
    if not completion.choices:
        raise LLMError(f"{where} answered the {purpose} call without a choice")
    return completion.choices[0].message


def _tool_input(completion: ChatCompletion, level: int, name: str) -> dict[str, Any] | None:
    """The JSON object a level produced, or None when it produced none."""
    if not completion.choices:
        return None
    message = completion.choices[0].message
    if level == 1:
        for call in message.tool_calls or []:
            function = getattr(call, "function", None)
            if function is not None and function.name == name:
                return _as_object(function.arguments)
        return None
    return first_json_object(message.content or "")


def _cut_off(completion: ChatCompletion, level: int, name: str) -> bool:
    """The answer stopped at the token limit after it had begun the JSON asked for.

    Why it matters: such an answer shows the level works and the limit was too small
    (or the model ran on), so stepping down a level would be learnt wrongly. Prose cut
    off at the limit, from a server that ignored the tool, is a level that failed."""
    if not completion.choices or completion.choices[0].finish_reason != "length":
        return False
    message = completion.choices[0].message
    if level == 1:
        return any(
            getattr(getattr(call, "function", None), "name", None) == name
            for call in message.tool_calls or []
        )
    return (message.content or "").lstrip().startswith(("{", "```"))


def _as_object(arguments: object) -> dict[str, Any] | None:
    """Function arguments as a dict: a JSON string (the spec) or an object (some servers)."""
    if isinstance(arguments, dict):
        return arguments
    if not isinstance(arguments, str):
        return None
    try:
        value = json.loads(arguments)
    except (ValueError, RecursionError):  # a model looping on brackets nests deep
        return None
    return value if isinstance(value, dict) else None


def first_json_object(text: str) -> dict[str, Any] | None:
    """The first JSON object in `text`: bare, in a ```json fence, or after some prose."""
    decoder = json.JSONDecoder()
    start = text.find("{")
    while start != -1:
        try:
            value, _ = decoder.raw_decode(text, start)
        except (ValueError, RecursionError):  # a model looping on brackets nests deep
            value = None
        if isinstance(value, dict):
            return value
        start = text.find("{", start + 1)
    return None


def _usage(usage: CompletionUsage | None) -> Usage:
    """OpenAI counts cached tokens inside `prompt_tokens`; we count them apart."""
    if usage is None:
        return Usage()
    details = usage.prompt_tokens_details
    cached = (details.cached_tokens if details is not None else None) or 0
    return Usage(
        input_tokens=max((usage.prompt_tokens or 0) - cached, 0),
        output_tokens=usage.completion_tokens or 0,
        cache_read_tokens=cached,
        cache_write_tokens=0,
    )


# --- error inspection --------------------------------------------------------------------


def _error_field(err: openai.APIStatusError, key: str) -> str | None:
    """A field of the `{"error": {...}}` envelope (`code`, `param`, `type`, `message`)."""
    body = err.body
    if isinstance(body, Mapping) and isinstance(body.get("error"), Mapping):
        body = body["error"]
    if isinstance(body, Mapping):
        value = body.get(key)
        return str(value) if value is not None else None
    return None


def _api_message(err: openai.OpenAIError) -> str:
    message = _error_field(err, "message") if isinstance(err, openai.APIStatusError) else None
    return (message or str(err))[:200]


def _refuses(err: openai.OpenAIError, feature: Feature) -> bool:
    """A 400/422 about `feature` (by `param` or by wording): the server lacks it."""
    if not isinstance(err, openai.APIStatusError) or err.status_code not in _REJECTED_STATUSES:
        return False
    param = (_error_field(err, "param") or "").lower()
    if feature == "tools" and param.startswith(("tools", "tool_choice")):
        return True
    if feature == "response_format" and param.startswith("response_format"):
        return True
    message = _api_message(err).lower()
    return any(word in message for word in _FEATURE_WORDS[feature])


def _wants_max_completion_tokens(err: openai.APIStatusError) -> bool:
    """OpenAI's answer to `max_tokens` for its reasoning models (400 unsupported_parameter)."""
    if err.status_code not in _REJECTED_STATUSES:
        return False
    if _error_field(err, "param") == "max_tokens":
        return True
    message = _api_message(err)
    return "max_tokens" in message and "max_completion_tokens" in message


def _is_unknown_model(err: openai.NotFoundError, model: str) -> bool:
    """A 404 about the model, not about the path (a server without `GET /models/{id}`)."""
    return _error_field(err, "code") == "model_not_found" or model in _api_message(err)


class _SinkFailed(Exception):
    """Carries an exception raised by the caller's sink past the stream's error handling."""

    def __init__(self, error: Exception) -> None:
        super().__init__(str(error))
        self.error = error


def _retry_after(err: openai.OpenAIError) -> float | None:
    """Seconds a 429 asked us to wait (`retry-after-ms`, else `retry-after`), if it said."""
    if not isinstance(err, openai.APIStatusError) or err.status_code != 429:
        return None
    headers = err.response.headers
    for name, divisor in (("retry-after-ms", 1000.0), ("retry-after", 1.0)):
        value = headers.get(name)
        if value is None:
            continue
        try:
            seconds = float(value) / divisor
        except ValueError:
            continue
        if seconds >= 0:
            return seconds
    return None
