"""A `ChatRuntime` for adapter tests: records what the adapter hands over.

Adapter tests check translation (platform event in, neutral message out, reply
rendered back) against the real platform client and our loopback platform server;
the engine behind the runtime is not what they test, so answers are set per test.
The end-to-end tests in tests/integration use the real runtime instead.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Literal

from bot.command_table import needs_moderator
from bot.interface import Attach, Started
from bot.messages import (
    CommandRequest,
    CommandResult,
    Community,
    IncomingMessage,
    Reply,
)
from sonality.llm import TextSink


class RecordingRuntime:
    """Implements `bot.interface.ChatRuntime`; every answer can be replaced by a test."""

    def __init__(
        self,
        *,
        refusal: str,
        command_result: Callable[[CommandRequest], CommandResult],
        completion_pool: dict[str, list[str]] | None = None,
    ) -> None:
        self.messages: list[IncomingMessage] = []
        self.commands: list[CommandRequest] = []
        self.completions: list[tuple[Community, str, str]] = []
        self.answer: Callable[[IncomingMessage], Reply | None] = lambda m: Reply(
            text=f"echo: {m.text}"
        )
        # Which messages get an answer; by default the addressed ones, as the real
        # runtime does in a mention channel (the default mode).
        self.hears: Callable[[IncomingMessage], bool] = lambda m: m.addressed
        self.refusal = refusal
        self.command_result = command_result
        self.completion_pool = completion_pool or {}
        self.gate: asyncio.Event | None = None  # when set, handle() waits for it
        # When set, a message handed over with a stream sink is answered by it (it feeds
        # the sink and returns the final reply, as the real runtime does).
        self.stream: Callable[[IncomingMessage, TextSink], Awaitable[Reply | None]] | None = None
        # (community id, reason) per removal; community ids the bot was (re)added to.
        self.removed: list[tuple[str, str]] = []
        self.added: list[str] = []
        #: Community ids the runtime says it keeps data for (`known_communities`).
        self.known: list[str] = []
        #: (community id, channel id) of each person's message not handed to `handle`.
        self.people_wrote: list[tuple[str, str]] = []
        #: (platform, message id, community id) of each deletion; (platform, message id,
        #: new text) of each edit, and whether an edit is to be answered anew.
        self.deleted: list[tuple[str, str, str | None]] = []
        self.edited: list[tuple[str, str, str | None]] = []
        self.answer_edits = True

    async def handle(
        self,
        message: IncomingMessage,
        on_text: TextSink | None = None,
        on_start: Started | None = None,
        attach: Attach | None = None,
    ) -> Reply | None:
        if attach is not None and self.hears(message):  # as the runtime: only if answered
            message = await attach(message)
        self.messages.append(message)
        if not self.hears(message):
            return None
        if on_start is not None:
            await on_start()
        if self.gate is not None:
            await self.gate.wait()
        if on_text is not None and self.stream is not None:
            return await self.stream(message, on_text)
        return self.answer(message)

    async def person_wrote(self, community_id: str, channel_id: str) -> None:
        self.people_wrote.append((community_id, channel_id))

    async def message_deleted(
        self, platform: str, message_id: str, community_id: str | None = None
    ) -> int:
        self.deleted.append((platform, message_id, community_id))
        return 0

    async def message_edited(self, platform: str, message_id: str, text: str | None) -> bool:
        self.edited.append((platform, message_id, text))
        return self.answer_edits and text is not None

    async def run_command(self, request: CommandRequest) -> CommandResult:
        self.commands.append(request)
        if needs_moderator(request.name, request.args) and not request.is_moderator:
            return CommandResult(text=self.refusal, ok=False, private=True)
        return self.command_result(request)

    async def drain(self, community_id: str | None = None) -> None:
        """Nothing learns here, so there is nothing to wait for."""

    def learning_status(self, community_id: str) -> str:
        return ""

    async def community_removed(self, community_id: str, reason: str) -> None:
        self.removed.append((community_id, reason))

    async def community_added(self, community_id: str) -> None:
        self.added.append(community_id)

    async def known_communities(self, platform: str) -> list[str]:
        removed = {cid for cid, _ in self.removed}
        return [c for c in self.known if c.startswith(f"{platform}:") and c not in removed]

    async def complete(
        self, community: Community, kind: Literal["version", "topic"], prefix: str
    ) -> list[str]:
        self.completions.append((community, kind, prefix))
        return [p for p in self.completion_pool.get(kind, []) if p.startswith(prefix)]
