"""Streamed replies through both real SDKs against the loopback fakes.

What must hold for each provider: the sink gets the reply piece by piece, in order,
while it arrives; the returned result is the whole text with the usage the server
reported (cache tokens included); a stream that breaks part-way raises `LLMError`
with a reason, never a partial result; without a sink nothing streams.
"""

from __future__ import annotations

import logging
import time
from typing import Literal

import pytest

from sonality.llm import ChatTurn, LLMError, SystemBlock
from tests.fakes.anthropic_server import Broken, Fault, Text
from tests.llm.conftest import Vendor

REPLY = "Tides follow the moon. " * 8 + "That is the short answer."
#: Long enough for Anthropic's 1,024-token cache minimum on the default model.
LONG_SYSTEM = "You are a patient tutor who explains the sea. " * 120


async def _reply(vendor: Vendor, sink: list[str] | None, system: str = "Be brief.") -> object:
    async def collect(piece: str) -> None:
        assert sink is not None
        sink.append(piece)

    return await vendor.client.reply(
        system=[SystemBlock(text=system, cache=True)],
        messages=[ChatTurn(role="user", content="Why are there tides?")],
        max_tokens=300,
        on_text=collect if sink is not None else None,
    )


async def test_stream_delivers_pieces_in_order_and_the_whole_result(vendor: Vendor) -> None:
    vendor.server.enqueue(Text(REPLY))
    pieces: list[str] = []
    result = await _reply(vendor, pieces)
    assert len(pieces) > 10  # word by word, not one lump
    assert "".join(pieces) == REPLY
    assert result.text == REPLY  # type: ignore[attr-defined]
    assert result.usage.output_tokens > 0  # type: ignore[attr-defined]
    assert result.usage.input_tokens > 0  # type: ignore[attr-defined]
    assert vendor.stream_requests() == 1


async def test_pieces_arrive_while_the_model_is_still_writing(vendor: Vendor) -> None:
    vendor.server.first_token_seconds = 0.2
    vendor.server.tokens_per_second = 40.0
    vendor.server.enqueue(Text(REPLY))
    start = time.perf_counter()
    first: list[float] = []

    async def sink(piece: str) -> None:
        if not first:
            first.append(time.perf_counter() - start)

    result = await vendor.client.reply(
        system=[SystemBlock(text="Be brief.")],
        messages=[ChatTurn(role="user", content="Why are there tides?")],
        max_tokens=300,
        on_text=sink,
    )
    total = time.perf_counter() - start
    words = len(REPLY.split())
    assert first[0] >= 0.2
    assert total >= 0.2 + (words - 1) / 40.0 * 0.9
    # The first piece came while most of the reply was still being written.
    assert first[0] < total / 2
    assert result.text == REPLY


async def test_streamed_usage_counts_cache_tokens(vendor: Vendor) -> None:
    if vendor.name == "openai":
        vendor.server.enqueue(Text(REPLY, usage={"cached_tokens": 1024, "prompt_tokens": 1500}))
    else:
        vendor.server.enqueue(Text(REPLY), Text(REPLY))
        await _reply(vendor, [], system=LONG_SYSTEM)  # writes the cache
    result = await _reply(vendor, [], system=LONG_SYSTEM)
    usage = result.usage  # type: ignore[attr-defined]
    assert usage.cache_read_tokens > 0
    if vendor.name == "openai":
        assert usage.cache_read_tokens == 1024
        assert usage.input_tokens == 1500 - 1024


@pytest.mark.parametrize("how", ["error", "drop"])
async def test_a_stream_broken_part_way_raises_and_never_returns_partial_text(
    vendor: Vendor, how: Literal["error", "drop"], caplog: pytest.LogCaptureFixture
) -> None:
    vendor.server.enqueue(Broken(REPLY, after=40, how=how))
    pieces: list[str] = []
    with caplog.at_level(logging.WARNING), pytest.raises(LLMError) as raised:
        await _reply(vendor, pieces)
    shown = "".join(pieces)
    assert 40 <= len(shown) < len(REPLY)
    assert REPLY.startswith(shown)
    assert "broke after" in str(raised.value)
    assert "stream" in caplog.text and "broke" in caplog.text


async def test_a_refusal_before_the_stream_is_the_usual_clear_error(vendor: Vendor) -> None:
    vendor.server.enqueue(Fault(400))
    pieces: list[str] = []
    with pytest.raises(LLMError) as raised:
        await _reply(vendor, pieces)
    assert pieces == []
    assert "400" in str(raised.value)


async def test_a_failing_sink_raises_its_own_error(vendor: Vendor) -> None:
    vendor.server.enqueue(Text(REPLY))

    async def sink(piece: str) -> None:
        raise KeyError("the platform went away")

    with pytest.raises(KeyError):
        await vendor.client.reply(
            system=[],
            messages=[ChatTurn(role="user", content="hi")],
            max_tokens=50,
            on_text=sink,
        )


async def test_without_a_sink_nothing_streams(vendor: Vendor) -> None:
    vendor.server.enqueue(Text(REPLY))
    result = await _reply(vendor, None)
    assert result.text == REPLY  # type: ignore[attr-defined]
    assert vendor.stream_requests() == 0
