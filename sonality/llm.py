"""The small LLM interface the engine depends on.

The engine never talks to a vendor SDK directly: it asks this protocol for a text
reply or for one forced tool call, and always gets token usage back so the host can
account for cost per community. `providers.anthropic` implements it with the
official SDK; tests drive that implementation against a loopback server.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Literal, Protocol, TypeVar

from pydantic import BaseModel, ConfigDict, Field


class Usage(BaseModel):
    """Token counts of one LLM call, as the provider reports them."""

    model_config = ConfigDict(frozen=True)

    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0

    def __add__(self, other: Usage) -> Usage:
        return Usage(
            input_tokens=self.input_tokens + other.input_tokens,
            output_tokens=self.output_tokens + other.output_tokens,
            cache_read_tokens=self.cache_read_tokens + other.cache_read_tokens,
            cache_write_tokens=self.cache_write_tokens + other.cache_write_tokens,
        )


class SystemBlock(BaseModel):
    """One piece of a system prompt; `cache=True` marks the end of a cacheable prefix."""

    model_config = ConfigDict(frozen=True)

    text: str
    cache: bool = False


class ChatTurn(BaseModel):
    """One message of a conversation sent to the model.

    `cache=True` marks the end of a prefix worth caching (a user's earlier turns that
    the next message will repeat). Like `SystemBlock.cache` it is a hint: the provider
    decides whether the prefix is long enough for its vendor to cache at all.
    """

    model_config = ConfigDict(frozen=True)

    role: Literal["user", "assistant"]
    content: str
    cache: bool = False


class TextResult(BaseModel):
    model_config = ConfigDict(frozen=True)

    text: str
    model: str
    usage: Usage = Field(default_factory=Usage)


class ToolResult(BaseModel):
    """The arguments the model passed to the forced tool (unvalidated: callers check)."""

    model_config = ConfigDict(frozen=True)

    tool_input: dict[str, Any]
    model: str
    usage: Usage = Field(default_factory=Usage)


class LLMError(RuntimeError):
    """The LLM could not produce an answer (after the client's own retries).

    `retry_after` (seconds), when known, says when trying again makes sense: learning
    that needs the model waits that long and retries in order instead of giving up.
    """

    def __init__(self, reason: str, *, retry_after: float | None = None) -> None:
        super().__init__(reason)
        self.retry_after = retry_after


#: Receives the text of a streamed reply piece by piece, in order, as it arrives.
TextSink = Callable[[str], Awaitable[None]]

R = TypeVar("R", TextResult, ToolResult)


class LLMClient(Protocol):
    """What the engine needs from a language model."""

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
        """Return a plain text answer. Raises `LLMError` when none can be had.

        With `on_text` the provider streams: the sink gets each piece of text as it
        arrives, and the returned result is still the whole reply with its usage. A
        stream that breaks part-way raises `LLMError`; the pieces already given to the
        sink are then all there is, and they are not a reply.
        """
        ...

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
        """Force the model to call `tool` once and return its input. Raises `LLMError`."""
        ...
