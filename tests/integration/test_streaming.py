"""Streamed replies through the real runtime, agent and SDK, per LLM vendor.

The neutral path: an adapter hands `Runtime.handle` a sink; the reply's text reaches it
piece by piece; learning starts only from the whole reply in the outbox; a stream that
breaks part-way ends with a short cut-off note, records nothing, and the log says why.
The terminal prints the pieces as they come.
"""

from __future__ import annotations

import logging
import os
from typing import Any

import pytest

from bot.messages import CUT_OFF, IncomingMessage, ReplyKind
from bot.runtime import Runtime
from tests.fakes.anthropic_server import Broken, Text
from tests.integration.conftest import ALICE, A, chat_requests
from tests.integration.test_terminal import ENTER, PROMPT, start_at_terminal, stop

REPLY = (
    "Tides come from the moon's pull on the oceans. The sun adds a smaller pull, "
    "so the highest tides arrive when both line up."
)


def _message(text: str) -> IncomingMessage:
    return IncomingMessage(community=A, channel_id="c1", user=ALICE, text=text)


async def test_a_streamed_reply_reaches_the_sink_and_is_learned_from_once_whole(
    runtime: Runtime, llm_server: Any
) -> None:
    llm_server.tokens_per_second = 200.0
    llm_server.enqueue(Text(REPLY))
    pieces: list[str] = []
    pending_when_streaming: list[int] = []
    agent = await runtime.registry.agent_for(A)

    async def sink(piece: str) -> None:
        pieces.append(piece)
        pending_when_streaming.append(len(await agent.store.pending_interactions()))

    reply = await runtime.handle(_message("Why are there tides?"), on_text=sink)
    assert reply is not None
    assert reply.kind is ReplyKind.ANSWER and reply.streamed
    assert reply.text == REPLY
    assert len(pieces) > 5 and "".join(pieces) == REPLY
    # While the text streamed, nothing was recorded yet: the outbox row comes after.
    assert set(pending_when_streaming) == {0}
    assert chat_requests(llm_server)[0].body.get("stream") is True
    await runtime.drain()
    assert agent.sponge.interaction_count == 1


async def test_a_stream_broken_part_way_ends_with_a_note_and_nothing_learned(
    runtime: Runtime, llm_server: Any, caplog: pytest.LogCaptureFixture
) -> None:
    llm_server.enqueue(Broken(REPLY, after=30, how="error"))
    pieces: list[str] = []

    async def sink(piece: str) -> None:
        pieces.append(piece)

    agent = await runtime.registry.agent_for(A)
    with caplog.at_level(logging.WARNING):
        reply = await runtime.handle(_message("Why are there tides?"), on_text=sink)
    assert reply is not None
    assert reply.kind is ReplyKind.NOTICE and reply.streamed
    assert reply.text == CUT_OFF
    shown = "".join(pieces)
    assert 30 <= len(shown) < len(REPLY) and REPLY.startswith(shown)
    assert await agent.store.pending_interactions() == []  # no outbox row
    await runtime.drain()
    assert agent.sponge.interaction_count == 0
    assert any(
        "reply cut off" in r.getMessage() and "nothing learned" in r.getMessage()
        for r in caplog.records
    )


async def test_without_a_sink_the_reply_is_not_streamed(runtime: Runtime, llm_server: Any) -> None:
    llm_server.enqueue(Text(REPLY))
    reply = await runtime.handle(_message("Why are there tides?"))
    assert reply is not None and not reply.streamed and reply.text == REPLY
    assert chat_requests(llm_server)[0].body.get("stream") is not True


async def test_the_terminal_prints_the_reply_as_it_arrives(tmp_path: Any, anthropic_server) -> None:
    anthropic_server.tokens_per_second = 8.0  # about 3 s for the whole reply
    anthropic_server.enqueue(Text(REPLY))
    proc, screen, controller = await start_at_terminal(tmp_path, anthropic_server)
    try:
        at = await screen.wait_for(PROMPT)
        os.write(controller, b"Why are there tides?" + ENTER)
        first = await screen.wait_for(b"sonality> Tides", at)
        # The start is on screen while the end has not been written yet.
        assert b"line up." not in screen.data[first:]
        await screen.wait_for(b"line up.", first)
    finally:
        await stop(proc, screen, controller)
