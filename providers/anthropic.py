"""`LLMClient` on the official Anthropic SDK (`anthropic.AsyncAnthropic`).

Why this module is thin: the SDK already retries 408/409/429/5xx/529 and connection
errors with backoff (honouring `retry-after-ms` / `retry-after`) and enforces the
timeout, so we configure it instead of writing our own loop. What we add is what the
engine needs and the SDK cannot know:

* one semaphore per instance caps concurrent calls; the host creates ONE instance per
  process and shares it between all communities, so a busy guild cannot open unbounded
  parallel requests (a slot is held through the SDK's retry sleeps, which is the
  backpressure we want while rate limited);
* prompt caching of the static system prefix (`SystemBlock.cache`);
* every SDK failure becomes `LLMError` with a short, human reason, so the engine has a
  single error type to handle and operators can read the log line.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import Any, cast

import anthropic
from anthropic import Omit
from anthropic.types import (
    AssistantMessageParam,
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

from sonality import config
from sonality.llm import ChatTurn, LLMClient, LLMError, SystemBlock, TextResult, ToolResult, Usage

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
        timeout: float = 60.0,
        max_concurrency: int = 8,
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
            http_client=anthropic.DefaultAioHttpClient(),
        )
        if not (self._client.api_key or self._client.auth_token or self._client.credentials):
            raise ValueError("no Anthropic API key: pass api_key or set ANTHROPIC_API_KEY")
        self._slots = asyncio.Semaphore(max_concurrency)

    async def reply(
        self,
        *,
        system: Sequence[SystemBlock],
        messages: Sequence[ChatTurn],
        max_tokens: int,
        model: str | None = None,
        purpose: str = "reply",
    ) -> TextResult:
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
            max_tokens,
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
        async with self._slots:
            try:
                return await self._client.messages.create(
                    model=model,
                    max_tokens=max_tokens,
                    system=_system_param(system) or anthropic.omit,
                    messages=_messages_param(messages),
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


def _system_param(blocks: Sequence[SystemBlock]) -> list[TextBlockParam]:
    params: list[TextBlockParam] = []
    for block in blocks:
        param: TextBlockParam = {"type": "text", "text": block.text}
        if block.cache:
            param["cache_control"] = {"type": "ephemeral"}
        params.append(param)
    return params


def _messages_param(turns: Sequence[ChatTurn]) -> list[MessageParam]:
    params: list[MessageParam] = []
    for turn in turns:
        if turn.role == "user":
            params.append(UserMessageParam(role="user", content=turn.content))
        else:
            params.append(AssistantMessageParam(role="assistant", content=turn.content))
    return params


def _usage(usage: SDKUsage) -> Usage:
    return Usage(
        input_tokens=usage.input_tokens or 0,
        output_tokens=usage.output_tokens or 0,
        cache_read_tokens=usage.cache_read_input_tokens or 0,
        cache_write_tokens=usage.cache_creation_input_tokens or 0,
    )
