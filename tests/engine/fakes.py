"""An in-process stand-in for our own `LLMClient` protocol, scripted per test."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from sonality.llm import ChatTurn, LLMError, SystemBlock, TextResult, ToolResult, Usage


@dataclass
class Call:
    kind: str
    system: list[SystemBlock]
    messages: list[ChatTurn]
    tool: dict[str, Any] | None
    max_tokens: int
    model: str | None
    purpose: str


@dataclass
class FakeLLM:
    """Returns queued answers in order; an `LLMError` instance in the queue is raised."""

    tool_inputs: list[dict[str, Any] | LLMError] = field(default_factory=list)
    texts: list[str | LLMError] = field(default_factory=list)
    calls: list[Call] = field(default_factory=list)
    usage: Usage = field(default_factory=lambda: Usage(input_tokens=100, output_tokens=20))

    async def reply(
        self,
        *,
        system: Sequence[SystemBlock],
        messages: Sequence[ChatTurn],
        max_tokens: int,
        model: str | None = None,
        purpose: str = "reply",
    ) -> TextResult:
        self.calls.append(
            Call("reply", list(system), list(messages), None, max_tokens, model, purpose)
        )
        answer = self.texts.pop(0)
        if isinstance(answer, LLMError):
            raise answer
        return TextResult(text=answer, model=model or "fake-model", usage=self.usage)

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
        self.calls.append(
            Call("tool", list(system), list(messages), tool, max_tokens, model, purpose)
        )
        answer = self.tool_inputs.pop(0)
        if isinstance(answer, LLMError):
            raise answer
        return ToolResult(tool_input=answer, model=model or "fake-model", usage=self.usage)
