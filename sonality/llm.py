"""The LLM interface the engine needs: a text reply or one forced tool call, each
with its token usage (implemented in `providers`)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Literal, Protocol, TypeVar

from pydantic import BaseModel, ConfigDict, Field, model_validator


class Usage(BaseModel):
    model_config = ConfigDict(frozen=True)

    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0

    def __add__(self, other: Usage) -> Usage:
        return Usage(**{f: getattr(self, f) + getattr(other, f) for f in Usage.model_fields})


class SystemBlock(BaseModel):
    """One piece of a system prompt; `cache=True` marks the end of a cacheable prefix."""

    model_config = ConfigDict(frozen=True)

    text: str
    cache: bool = False


#: The picture formats every vendor's vision models take.
ImageMediaType = Literal["image/png", "image/jpeg", "image/gif", "image/webp"]


class ImagePart(BaseModel):
    """A picture that goes with a user turn: its bytes and what format they are in.

    Why bytes and not a link: the model's vendor must never be sent to fetch a URL
    from a chat platform (it could not, without the platform's token), and the host
    checked the file before handing it over."""

    model_config = ConfigDict(frozen=True)

    media_type: ImageMediaType
    data: bytes = Field(min_length=1)


class ChatTurn(BaseModel):
    """`cache=True` marks the end of a prefix worth caching (a hint, as for
    `SystemBlock`). `images` go with a user turn's text, shown before it."""

    model_config = ConfigDict(frozen=True)

    role: Literal["user", "assistant"]
    content: str
    cache: bool = False
    images: tuple[ImagePart, ...] = ()

    @model_validator(mode="after")
    def _images_from_users_only(self) -> ChatTurn:
        if self.images and self.role != "user":
            raise ValueError("only a user turn can carry images")
        return self


class TextResult(BaseModel):
    model_config = ConfigDict(frozen=True)

    text: str
    model: str
    usage: Usage = Field(default_factory=Usage)


class ToolResult(BaseModel):
    """The forced tool's arguments, unvalidated."""

    model_config = ConfigDict(frozen=True)

    tool_input: dict[str, Any]
    model: str
    usage: Usage = Field(default_factory=Usage)


class LLMError(RuntimeError):
    """No answer after the client's own retries; `retry_after` (seconds) if known.
    `spent`: what calls that did answer cost before the failure (a client that tries
    several ways in turn), so a spending limit can count it."""

    def __init__(
        self, reason: str, *, retry_after: float | None = None, spent: TextResult | None = None
    ) -> None:
        super().__init__(reason)
        self.retry_after = retry_after
        self.spent = spent


#: Receives a streamed reply piece by piece.
TextSink = Callable[[str], Awaitable[None]]

R = TypeVar("R", TextResult, ToolResult)


class LLMClient(Protocol):
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
        """A text answer, streamed to `on_text` if given; raises `LLMError` (a broken
        stream too, whatever the sink already got)."""

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
        """Force one call of `tool` and return its input; raises `LLMError`."""
