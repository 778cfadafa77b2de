"""`LLMClient` on the official Anthropic SDK (`anthropic.AsyncAnthropic`).

Why this module is thin: the SDK already retries 408/409/429/5xx/529 and connection
errors with backoff (honouring `retry-after-ms` / `retry-after`) and enforces the
timeout, so we configure it instead of writing our own loop. What we add is what the
engine needs and the SDK cannot know:

* one semaphore per instance caps concurrent calls; the host creates ONE instance per
  process and shares it between all communities, so a busy guild cannot open unbounded
  parallel requests (a slot is held through the SDK's retry sleeps, which is the
  backpressure we want while rate limited);
* prompt caching where it pays: a `cache_control` mark only where the engine marked a
  stable prefix (`SystemBlock.cache`, `ChatTurn.cache`) and it reaches the model's minimum;
* every SDK failure becomes `LLMError` with a short, human reason, so the engine has a
  single error type to handle and operators can read the log line;
* each call asks for at most its role's output cap (`providers.OutputCap`). Anthropic
  has no repetition penalty to send, so the cap is the only guard against a reply that
  runs on.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
from collections.abc import Sequence
from typing import Any, cast

import anthropic
from anthropic import Omit
from anthropic.types import (
    AssistantMessageParam,
    Base64ImageSourceParam,
    ImageBlockParam,
    Message,
    MessageParam,
    TextBlock,
    TextBlockParam,
    ToolChoiceToolParam,
    ToolParam,
    ToolUseBlock,
    UserMessageParam,
)
from anthropic.types import Usage as SDKUsage

from providers import HOSTED_TIMEOUT_SECONDS, OutputCap, capped, shared_tls_context
from sonality import config
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

# Statuses the SDK retries by itself; failures with them have used up the retries.
_RETRIED_STATUSES = frozenset({408, 409, 429})


class AnthropicLLM(LLMClient):
    """The production `LLMClient`: one shared instance per process."""

    def __init__(
        self,
        *,
        api_key: str | None = None,
        base_url: str | None = None,
        default_model: str = config.MODEL,
        max_retries: int = 3,
        timeout: float = HOSTED_TIMEOUT_SECONDS,
        max_concurrency: int = 8,
        output_cap: OutputCap | None = None,
    ) -> None:
        """`api_key`/`base_url` None fall back to the SDK's own environment lookup
        (`ANTHROPIC_API_KEY`, `ANTHROPIC_BASE_URL`). Raises `ValueError` when no
        credential can be found, so a misconfigured bot fails at start, not on the
        first message."""
        if max_concurrency < 1:
            raise ValueError("max_concurrency must be at least 1")
        self.default_model = default_model
        self._max_retries = max_retries
        self._timeout = timeout
        self._client = anthropic.AsyncAnthropic(
            api_key=api_key,
            base_url=base_url,
            max_retries=max_retries,
            timeout=timeout,
            # The SDK's aiohttp transport: 3.5 instead of 5.2 ms of event-loop CPU per
            # call under 100 chatting communities (the default pool rescans every
            # connection on every request). Retries and timeouts are still the SDK's.
            http_client=anthropic.DefaultAioHttpClient(verify=shared_tls_context()),
        )
        if not (self._client.api_key or self._client.auth_token or self._client.credentials):
            raise ValueError("no Anthropic API key: pass api_key or set ANTHROPIC_API_KEY")
        self._slots = asyncio.Semaphore(max_concurrency)
        self._output_cap = output_cap

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
        max_tokens = capped(max_tokens, purpose, self._output_cap)
        if on_text is not None:
            message = await self._stream(purpose, system, messages, max_tokens, model, on_text)
        else:
            message = await self._create(purpose, system, messages, max_tokens, model)
        text = "".join(block.text for block in message.content if isinstance(block, TextBlock))
        return TextResult(text=text, model=message.model, usage=_usage(message.usage))

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
        """Returns `{}` as the input when the model answered without calling the tool:
        the caller validates the input anyway and retries on invalid."""
        name = str(tool["name"])
        message = await self._create(
            purpose,
            system,
            messages,
            capped(max_tokens, purpose, self._output_cap),
            model,
            tools=[cast(ToolParam, tool)],
            tool_choice={"type": "tool", "name": name},
        )
        tool_input: dict[str, Any] = {}
        for block in message.content:
            if isinstance(block, ToolUseBlock) and block.name == name:
                tool_input = dict(block.input)
                break
        else:
            log.info("%s: model %s answered without calling tool %s", purpose, message.model, name)
        return ToolResult(tool_input=tool_input, model=message.model, usage=_usage(message.usage))

    async def aclose(self) -> None:
        """Close the SDK's HTTP connection pool (call once at shutdown)."""
        await self._client.close()

    async def _create(
        self,
        purpose: str,
        system: Sequence[SystemBlock],
        messages: Sequence[ChatTurn],
        max_tokens: int,
        model: str | None,
        tools: list[ToolParam] | Omit = anthropic.omit,
        tool_choice: ToolChoiceToolParam | Omit = anthropic.omit,
    ) -> Message:
        """One Messages API call inside a concurrency slot; SDK errors become LLMError."""
        model = model or self.default_model
        cached_system, cached_turns = _breakpoints(
            model, tools if isinstance(tools, list) else [], system, messages
        )
        async with self._slots:
            try:
                return await self._client.messages.create(
                    model=model,
                    max_tokens=max_tokens,
                    system=_system_param(system, cached_system) or anthropic.omit,
                    messages=_messages_param(messages, cached_turns),
                    tools=tools,
                    tool_choice=tool_choice,
                )
            except anthropic.AnthropicError as err:
                reason = self._describe(err)
                request_id = getattr(err, "request_id", None)
                log.warning(
                    "Anthropic %s call (model %s) failed: %s%s",
                    purpose,
                    model,
                    reason,
                    f" [request {request_id}]" if request_id else "",
                )
                raise LLMError(reason) from err

    async def _stream(
        self,
        purpose: str,
        system: Sequence[SystemBlock],
        messages: Sequence[ChatTurn],
        max_tokens: int,
        model: str | None,
        on_text: TextSink,
    ) -> Message:
        """The SDK's own Messages stream: each text delta goes to `on_text` as it comes.

        A stream counts only when it reached `message_stop`: an `error` event part-way
        (Anthropic sends `overloaded_error` that way) or a dropped connection raises
        `LLMError`, so a cut-off reply is never taken for a whole one. Errors raised by
        the sink itself pass through unchanged (they are the caller's, not the model's).
        """
        model = model or self.default_model
        cached_system, cached_turns = _breakpoints(model, [], system, messages)
        delivered = 0
        async with self._slots:
            try:
                async with self._client.messages.stream(
                    model=model,
                    max_tokens=max_tokens,
                    system=_system_param(system, cached_system) or anthropic.omit,
                    messages=_messages_param(messages, cached_turns),
                ) as stream:
                    finished = False
                    async for event in stream:
                        if event.type == "text" and event.text:
                            delivered += len(event.text)
                            try:
                                await on_text(event.text)
                            except Exception as err:
                                raise _SinkFailed(err) from err
                        elif event.type == "message_stop":
                            finished = True
                    if not finished:
                        raise LLMError(self._broken(purpose, model, delivered, "it ended early"))
                    return await stream.get_final_message()
            except _SinkFailed as failed:
                raise failed.error from None
            except LLMError:
                raise
            except anthropic.AnthropicError as err:
                if delivered or (
                    isinstance(err, anthropic.APIStatusError) and err.status_code < 300
                ):
                    raise LLMError(
                        self._broken(purpose, model, delivered, _stream_error(err))
                    ) from err
                reason = self._describe(err)
                log.warning("Anthropic %s stream (model %s) failed: %s", purpose, model, reason)
                raise LLMError(reason) from err
            except Exception as err:  # the transport's own error when the connection drops
                reason = f"{type(err).__name__}: {str(err)[:200]}"
                raise LLMError(self._broken(purpose, model, delivered, reason)) from err

    def _broken(self, purpose: str, model: str, delivered: int, why: str) -> str:
        reason = f"the Anthropic reply stream broke after {delivered} characters ({why})"
        log.warning("Anthropic %s stream (model %s): %s", purpose, model, reason)
        return reason

    def _describe(self, err: anthropic.AnthropicError) -> str:
        """A one-line reason an operator can act on (key, quota, outage, network)."""
        retried = f" after {self._max_retries} retries" if self._max_retries else ""
        if isinstance(err, anthropic.APITimeoutError):
            return f"the Anthropic API did not answer within {self._timeout:g}s (timeout){retried}"
        if isinstance(err, anthropic.APIConnectionError):
            return f"could not connect to the Anthropic API (connection error){retried}"
        if isinstance(err, anthropic.APIStatusError):
            status = err.status_code
            if status == 401:
                return "the Anthropic API key was rejected (401 authentication_error)"
            if status == 403:
                return "the Anthropic API key is not permitted to do this (403 permission_error)"
            if status == 429:
                return f"rate limited by the Anthropic API (429){retried}"
            if status == 529:
                return f"the Anthropic API is overloaded (529){retried}"
            if status >= 500 or status in _RETRIED_STATUSES:
                return f"the Anthropic API failed with status {status}{retried}"
            detail = (err.api_message or err.type or "")[:200]
            return f"the Anthropic API rejected the request ({status}: {detail})"
        return f"unexpected Anthropic SDK error: {type(err).__name__}: {str(err)[:200]}"


#: Shortest prefix Anthropic will cache, per model, in tokens (Anthropic's prompt-caching
#: documentation, read 2026-11). Keys are model-id prefixes; unlisted models need 1,024.
CACHE_MINIMUM_TOKENS: dict[str, int] = {
    "claude-opus-4-6": 4096,
    "claude-opus-4-5": 4096,
    "claude-haiku-4-5": 4096,
    "claude-3-5-haiku": 2048,
    "claude-3-haiku": 2048,
}
DEFAULT_CACHE_MINIMUM = 1024
#: The API refuses a request with more blocks marked for caching than this.
MAX_CACHE_BREAKPOINTS = 4
#: A generous estimate (English runs nearer 4): a prefix that may reach the minimum is
#: marked, since a mark on a prefix that falls short costs nothing.
CHARS_PER_TOKEN = 3.5


def cache_minimum(model: str) -> int:
    best = max((k for k in CACHE_MINIMUM_TOKENS if model.startswith(k)), key=len, default=None)
    return CACHE_MINIMUM_TOKENS[best] if best is not None else DEFAULT_CACHE_MINIMUM


def _breakpoints(
    model: str,
    tools: Sequence[Any],
    system: Sequence[SystemBlock],
    turns: Sequence[ChatTurn],
) -> tuple[set[int], set[int]]:
    """Which system blocks and which turns get `cache_control`.

    The engine marks where a stable prefix ends; a mark is kept only where the prefix
    (tools, then system, then messages, as Anthropic orders it) is long enough for the
    model's minimum, and only the last four, which cover the most.
    """
    minimum = cache_minimum(model)
    chars = sum(len(json.dumps(tool)) for tool in tools)
    marks: list[tuple[str, int]] = []
    for index, block in enumerate(system):
        chars += len(block.text)
        if block.cache and chars / CHARS_PER_TOKEN >= minimum:
            marks.append(("system", index))
    for index, turn in enumerate(turns):
        chars += len(turn.content)
        if turn.cache and chars / CHARS_PER_TOKEN >= minimum:
            marks.append(("turn", index))
    kept = marks[-MAX_CACHE_BREAKPOINTS:]
    return {i for kind, i in kept if kind == "system"}, {i for kind, i in kept if kind == "turn"}


def _system_param(blocks: Sequence[SystemBlock], cached: set[int]) -> list[TextBlockParam]:
    params: list[TextBlockParam] = []
    for index, block in enumerate(blocks):
        param: TextBlockParam = {"type": "text", "text": block.text}
        if index in cached:
            param["cache_control"] = {"type": "ephemeral"}
        params.append(param)
    return params


def _messages_param(turns: Sequence[ChatTurn], cached: set[int]) -> list[MessageParam]:
    params: list[MessageParam] = []
    for index, turn in enumerate(turns):
        content: str | list[TextBlockParam] = turn.content
        if index in cached:
            content = [
                {"type": "text", "text": turn.content, "cache_control": {"type": "ephemeral"}}
            ]
        if turn.images:
            # Anthropic reads pictures best placed before the text about them.
            text: list[TextBlockParam] = (
                content if isinstance(content, list) else [{"type": "text", "text": content}]
            )
            blocks: list[ImageBlockParam | TextBlockParam] = [
                *(_image_block(image) for image in turn.images),
                *text,
            ]
            params.append(UserMessageParam(role="user", content=blocks))
        elif turn.role == "user":
            params.append(UserMessageParam(role="user", content=content))
        else:
            params.append(AssistantMessageParam(role="assistant", content=content))
    return params


def _image_block(image: ImagePart) -> ImageBlockParam:
    source = Base64ImageSourceParam(
        type="base64",
        media_type=image.media_type,
        data=base64.standard_b64encode(image.data).decode("ascii"),
    )
    return ImageBlockParam(type="image", source=source)


class _SinkFailed(Exception):
    """Carries an exception raised by the caller's sink past the stream's error handling."""

    def __init__(self, error: Exception) -> None:
        super().__init__(str(error))
        self.error = error


def _stream_error(err: anthropic.AnthropicError) -> str:
    """What an `error` event in the stream said (`overloaded_error: Overloaded`)."""
    body = getattr(err, "body", None)
    if isinstance(body, dict) and isinstance(body.get("error"), dict):
        detail = body["error"]
        return f"{detail.get('type', 'error')}: {str(detail.get('message', ''))[:200]}"
    return f"{type(err).__name__}: {str(err)[:200]}"


def _usage(usage: SDKUsage) -> Usage:
    return Usage(
        input_tokens=usage.input_tokens or 0,
        output_tokens=usage.output_tokens or 0,
        cache_read_tokens=usage.cache_read_input_tokens or 0,
        cache_write_tokens=usage.cache_creation_input_tokens or 0,
    )
