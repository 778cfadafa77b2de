"""A base for `LLMClient` wrappers that forward every call unchanged.

Why one base: the host wraps the shared client several times (spending limit, health,
bench timing, evaluation meter), and every wrapper must forward each argument,
including ones added later such as `on_text`. Subclasses override `_after` to note a
finished call, or `_forward` to act around it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from sonality.llm import (
    ChatTurn,
    LLMClient,
    LLMError,
    R,
    SystemBlock,
    TextResult,
    TextSink,
    ToolResult,
)


class ForwardingLLM(LLMClient):
    """An `LLMClient` that hands every call to `inner` unchanged (the stream sink too)."""

    def __init__(self, inner: LLMClient) -> None:
        self.inner = inner

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
        async def call() -> TextResult:
            return await self.inner.reply(
                system=system,
                messages=messages,
                max_tokens=max_tokens,
                model=model,
                purpose=purpose,
                on_text=on_text,
            )

        return await self._forward(purpose, model, call)

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
        async def call() -> ToolResult:
            return await self.inner.call_tool(
                system=system,
                messages=messages,
                tool=tool,
                max_tokens=max_tokens,
                model=model,
                purpose=purpose,
            )

        return await self._forward(purpose, model, call)

    async def _forward(
        self, purpose: str, model: str | None, call: Callable[[], Awaitable[R]]
    ) -> R:
        """Make the call (`call()` starts it), then `_after`. Override to act around it."""
        try:
            result = await call()
        except LLMError as err:
            if err.spent is not None:
                await self._spent(purpose, err.spent)
            raise
        await self._after(purpose, result)
        return result

    async def _after(self, purpose: str, result: TextResult | ToolResult) -> None:
        """Called with each successful result; nothing by default."""

    async def _spent(self, purpose: str, spent: TextResult) -> None:
        """Called with what a failed call cost before it failed (`LLMError.spent`);
        nothing by default."""
