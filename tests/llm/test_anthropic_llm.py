"""`AnthropicLLM` through the real `AsyncAnthropic` client against the loopback fake.

Nothing is mocked or patched: these tests check what actually goes over the wire
(auth header, cache_control, tool_choice) and how the SDK's own retries and timeouts
surface as `LLMError`.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import socket
import time
import typing
import warnings
from typing import Any

import anthropic
import pytest
from anthropic.resources.messages.messages import DEPRECATED_MODELS

from providers.anthropic import AnthropicLLM
from sonality.config import DEFAULT_MODEL
from sonality.llm import ChatTurn, LLMError, SystemBlock, Usage
from tests.fakes.anthropic_fixtures import FAKE_API_KEY, client_for
from tests.fakes.anthropic_server import AnthropicFake, Delay, Fault, Text, ToolUse

HELLO = [ChatTurn(role="user", content="Hello there")]
TOOL: dict[str, Any] = {
    "name": "rate_it",
    "description": "Rate the message.",
    "input_schema": {
        "type": "object",
        "properties": {"score": {"type": "number"}, "label": {"type": "string"}},
        "required": ["score", "label"],
    },
}
_ENUM = {"type": "string", "enum": ["a"]}
# The shape of the engine's ESS tool (inlined: this file tests the client and the fake).
ESS_TOOL: dict[str, Any] = {
    "name": "classify_evidence",
    "input_schema": {
        "type": "object",
        "properties": {
            "score": {"type": "number"},
            "reasoning_type": _ENUM,
            "source_reliability": _ENUM,
            "internal_consistency": {"type": "boolean"},
            "novelty": {"type": "number"},
            "topics": {"type": "array", "items": {"type": "string"}},
            "summary": {"type": "string"},
            "opinion_direction": _ENUM,
        },
    },
}


async def test_reply_joins_text_blocks_and_maps_usage(
    anthropic_server: AnthropicFake,
    llm: AnthropicLLM,
) -> None:
    anthropic_server.enqueue(
        Text(
            ["Hello ", "world"],
            usage={
                "input_tokens": 11,
                "output_tokens": 7,
                "cache_read_input_tokens": 5,
                "cache_creation_input_tokens": None,
            },
        )
    )
    result = await llm.reply(system=[SystemBlock(text="Be brief.")], messages=HELLO, max_tokens=50)
    assert result.text == "Hello world"
    assert result.model == DEFAULT_MODEL
    assert result.usage == Usage(
        input_tokens=11, output_tokens=7, cache_read_tokens=5, cache_write_tokens=0
    )
    body = anthropic_server.requests[0].body
    assert body["model"] == DEFAULT_MODEL
    assert body["max_tokens"] == 50
    assert body["messages"] == [{"role": "user", "content": "Hello there"}]
    assert "temperature" not in body and "tools" not in body


LONG = "static identity " * 300  # 4,800 characters: over Sonnet's 1,024-token minimum


async def test_cache_control_only_where_the_prefix_reaches_the_minimum(
    anthropic_server: AnthropicFake,
    llm: AnthropicLLM,
) -> None:
    system = [SystemBlock(text=LONG, cache=True), SystemBlock(text="state")]
    first = await llm.reply(system=system, messages=HELLO, max_tokens=50)
    second = await llm.reply(system=system, messages=HELLO, max_tokens=50)

    sent = anthropic_server.requests[0].body["system"]
    assert sent[0] == {"type": "text", "text": LONG, "cache_control": {"type": "ephemeral"}}
    assert sent[1] == {"type": "text", "text": "state"}
    # The fake reports the cached prefix as written once, then read.
    assert first.usage.cache_write_tokens == 1200 and first.usage.cache_read_tokens == 0
    assert second.usage.cache_read_tokens == 1200 and second.usage.cache_write_tokens == 0
    assert first.text == "[reply] Hello there"


async def test_a_short_prefix_is_not_marked_and_never_reads_the_cache(
    anthropic_server: AnthropicFake,
    llm: AnthropicLLM,
) -> None:
    system = [SystemBlock(text="static identity " * 20, cache=True), SystemBlock(text="state")]
    for _ in range(3):
        result = await llm.reply(system=system, messages=HELLO, max_tokens=50)
        assert result.usage.cache_read_tokens == 0 and result.usage.cache_write_tokens == 0
    assert "cache_control" not in anthropic_server.requests[0].body["system"][0]


async def test_the_fake_never_caches_below_the_models_minimum(
    anthropic_server: AnthropicFake,
) -> None:
    """The fake itself, with a mark the provider would not send: Haiku 4.5 needs 4,096
    tokens, so 1,200 marked tokens are processed uncached, however often they repeat."""
    async with anthropic.AsyncAnthropic(
        api_key=FAKE_API_KEY, base_url=anthropic_server.base_url
    ) as client:
        for _ in range(2):
            message = await client.messages.create(
                model="claude-haiku-4-5",
                max_tokens=20,
                system=[{"type": "text", "text": LONG, "cache_control": {"type": "ephemeral"}}],
                messages=[{"role": "user", "content": "hi"}],
            )
            assert message.usage.cache_read_input_tokens == 0
            assert message.usage.cache_creation_input_tokens == 0
            assert message.usage.input_tokens == 1201


async def test_a_growing_conversation_reads_the_previous_prefix(
    anthropic_server: AnthropicFake,
    llm: AnthropicLLM,
) -> None:
    """Each request marks its last earlier turn; the next one, one exchange longer,
    reads what the previous one wrote and writes only the new exchange."""
    system = [SystemBlock(text=LONG, cache=True)]
    turns: list[ChatTurn] = []
    usages = []
    for i in range(3):
        earlier = [t.model_copy(update={"cache": j == len(turns) - 1}) for j, t in enumerate(turns)]
        message = ChatTurn(role="user", content=f"question {i} " * 10)
        result = await llm.reply(system=system, messages=[*earlier, message], max_tokens=50)
        usages.append(result.usage)
        turns += [message, ChatTurn(role="assistant", content=result.text)]
    assert usages[0].cache_write_tokens == 1200  # no earlier turns yet: the system prompt
    for before, after in itertools.pairwise(usages):
        assert after.cache_read_tokens == before.cache_read_tokens + before.cache_write_tokens
        assert 0 < after.cache_write_tokens < 100  # one exchange, not the whole prefix
    assert anthropic_server.requests[2].body["messages"][-2]["content"][0]["cache_control"]


async def test_more_than_four_cache_marks_are_refused_like_the_real_api(
    anthropic_server: AnthropicFake,
) -> None:
    block: anthropic.types.TextBlockParam = {
        "type": "text",
        "text": "x",
        "cache_control": {"type": "ephemeral"},
    }
    async with anthropic.AsyncAnthropic(
        api_key=FAKE_API_KEY, base_url=anthropic_server.base_url, max_retries=0
    ) as client:
        with pytest.raises(anthropic.BadRequestError, match="maximum of 4 blocks"):
            await client.messages.create(
                model=DEFAULT_MODEL,
                max_tokens=20,
                system=[block] * 5,
                messages=[{"role": "user", "content": "hi"}],
            )


@pytest.mark.parametrize(
    ("messages", "system", "refusal"),
    [
        ([{"role": "user", "content": ""}], None, "all messages must have non-empty content"),
        ([{"role": "user", "content": [{"type": "text", "text": ""}]}], None, "must be non-empty"),
        ([{"role": "user", "content": " \n"}], None, "must contain non-whitespace text"),
        (
            [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Sure "}],
            None,
            "cannot end with trailing whitespace",
        ),
        ([{"role": "system", "content": "hi"}], None, "Input should be 'user' or 'assistant'"),
        ([{"role": "user", "content": "hi"}], [{"type": "text", "text": ""}], "system: text"),
    ],
    ids=["empty", "empty-block", "whitespace", "prefill-space", "system-role", "empty-system"],
)
async def test_empty_or_blank_text_is_refused_like_the_real_api(
    anthropic_server: AnthropicFake, messages: Any, system: Any, refusal: str
) -> None:
    async with anthropic.AsyncAnthropic(
        api_key=FAKE_API_KEY, base_url=anthropic_server.base_url, max_retries=0
    ) as client:
        extra = {} if system is None else {"system": system}
        with pytest.raises(anthropic.BadRequestError, match=refusal):
            await client.messages.create(
                model=DEFAULT_MODEL, max_tokens=20, messages=messages, **extra
            )


async def test_turns_the_real_api_takes_are_taken(anthropic_server: AnthropicFake) -> None:
    """Merged turns of one role, an assistant turn first, and an empty prefill last."""
    async with anthropic.AsyncAnthropic(
        api_key=FAKE_API_KEY, base_url=anthropic_server.base_url, max_retries=0
    ) as client:
        await client.messages.create(
            model=DEFAULT_MODEL,
            max_tokens=20,
            messages=[
                {"role": "assistant", "content": "Hello."},
                {"role": "user", "content": "hi"},
                {"role": "user", "content": "again"},
                {"role": "assistant", "content": ""},
            ],
        )


async def test_call_tool_forces_the_tool_and_returns_its_input(
    anthropic_server: AnthropicFake,
    llm: AnthropicLLM,
) -> None:
    anthropic_server.enqueue(ToolUse({"score": 0.7, "label": "solid"}))
    result = await llm.call_tool(system=[], messages=HELLO, tool=TOOL, max_tokens=200)
    assert result.tool_input == {"score": 0.7, "label": "solid"}
    assert result.usage.input_tokens > 0 and result.usage.output_tokens > 0
    body = anthropic_server.requests[0].body
    assert body["tool_choice"] == {"type": "tool", "name": "rate_it"}
    assert body["tools"] == [TOOL]
    assert "system" not in body  # an empty system prompt is omitted, not sent as []


async def test_call_tool_without_tool_use_returns_empty_input(
    anthropic_server: AnthropicFake,
    llm: AnthropicLLM,
) -> None:
    anthropic_server.enqueue(Text("I would rather not."))
    result = await llm.call_tool(system=[], messages=HELLO, tool=TOOL, max_tokens=200)
    assert result.tool_input == {}


async def test_brain_answers_ess_reply_and_reflection_without_a_script(
    anthropic_server: AnthropicFake,
    llm: AnthropicLLM,
) -> None:
    brain = anthropic_server.brain
    brain.ess_rule(
        contains="nuclear",
        score=0.8,
        direction="supports",
        topics=["nuclear_energy"],
        novelty=0.9,
        reasoning_type="empirical_data",
        source_reliability="peer_reviewed",
        summary="Nuclear is safe per data.",
    )
    brain.reply_rule(contains="REFLECT-MARK", text="reflected!", in_system=True)

    def ess_turn(message: str) -> list[ChatTurn]:
        # The personality mentions nuclear too: only the <message> section may match.
        prompt = (
            f"Rate the text in <message> tags.\n<message>\n{message}\n</message>\n"
            "<agent_personality>I keep thinking about nuclear power.</agent_personality>"
        )
        return [ChatTurn(role="user", content=prompt)]

    strong = await llm.call_tool(
        system=[], messages=ess_turn("Nuclear data: 0.03 deaths/TWh"), tool=ESS_TOOL, max_tokens=300
    )
    assert strong.tool_input == {
        "score": 0.8,
        "reasoning_type": "empirical_data",
        "source_reliability": "peer_reviewed",
        "internal_consistency": True,
        "novelty": 0.9,
        "topics": ["nuclear_energy"],
        "summary": "Nuclear is safe per data.",
        "opinion_direction": "supports",
    }
    weak = await llm.call_tool(
        system=[], messages=ess_turn("hi <b>all</b> &amp; you"), tool=ESS_TOOL, max_tokens=300
    )
    assert weak.tool_input["score"] == 0.02
    assert weak.tool_input["reasoning_type"] == "no_argument"
    assert weak.tool_input["opinion_direction"] == "neutral"
    assert weak.tool_input["topics"] == ["small_talk"]
    assert weak.tool_input["summary"] == "hi all & you"

    scripted = await llm.reply(
        system=[SystemBlock(text="REFLECT-MARK")], messages=HELLO, max_tokens=50
    )
    assert scripted.text == "reflected!"
    reflection = [
        ChatTurn(
            role="user",
            content="<current_self_description>\nI like &lt;data&gt;.\n</current_self_description>",
        )
    ]
    echoed = await llm.reply(system=[], messages=reflection, max_tokens=500)
    assert echoed.text == "I like <data>."


async def test_429_with_retry_after_ms_is_retried_by_the_sdk(
    anthropic_server: AnthropicFake,
    llm: AnthropicLLM,
) -> None:
    # 600 ms is longer than the SDK's own first backoff (<= 0.5 s), so the elapsed time
    # shows the header was honoured.
    anthropic_server.enqueue(Fault(status=429, retry_after_ms=600), Text("finally"))
    started = time.monotonic()
    result = await llm.reply(system=[], messages=HELLO, max_tokens=50)
    assert result.text == "finally"
    assert time.monotonic() - started >= 0.6
    assert len(anthropic_server.requests) == 2
    retry_counts = [r.headers.get("x-stainless-retry-count") for r in anthropic_server.requests]
    assert retry_counts == ["0", "1"]


async def test_529_overloaded_then_success(
    anthropic_server: AnthropicFake,
    llm: AnthropicLLM,
) -> None:
    anthropic_server.enqueue(Fault(status=529, retry_after_ms=10), Text("ok"))
    result = await llm.reply(system=[], messages=HELLO, max_tokens=50)
    assert result.text == "ok"
    assert len(anthropic_server.requests) == 2


async def test_500_three_times_exhausts_retries(
    anthropic_server: AnthropicFake,
    llm: AnthropicLLM,
    caplog: pytest.LogCaptureFixture,
) -> None:
    anthropic_server.enqueue(*[Fault(status=500, retry_after_ms=10)] * 3, Text("too late"))
    with caplog.at_level(logging.WARNING, logger="providers.anthropic"):
        with pytest.raises(LLMError, match=r"status 500 after 2 retries") as caught:
            await llm.reply(system=[], messages=HELLO, max_tokens=50, purpose="reflection")
    assert isinstance(caught.value.__cause__, anthropic.InternalServerError)
    assert len(anthropic_server.requests) == 3
    assert anthropic_server.script_left == 1
    [record] = [r for r in caplog.records if r.name == "providers.anthropic"]
    assert record.levelno == logging.WARNING and "reflection" in record.getMessage()


async def test_overloaded_exhausted_says_overloaded(
    anthropic_server: AnthropicFake,
    llm: AnthropicLLM,
) -> None:
    anthropic_server.enqueue(*[Fault(status=529, retry_after_ms=10)] * 3)
    with pytest.raises(LLMError, match="overloaded"):
        await llm.reply(system=[], messages=HELLO, max_tokens=50)


async def test_rejected_key_is_reported_distinctly_and_not_retried(
    anthropic_server: AnthropicFake,
) -> None:
    client = client_for(anthropic_server, api_key="sk-ant-wrong")
    try:
        with pytest.raises(LLMError, match="API key was rejected"):
            await client.reply(system=[], messages=HELLO, max_tokens=50)
    finally:
        await client.aclose()
    assert len(anthropic_server.requests) == 1


async def test_bad_request_is_not_retried(
    anthropic_server: AnthropicFake,
    llm: AnthropicLLM,
) -> None:
    with pytest.raises(LLMError, match=r"rejected the request \(400: messages"):
        await llm.reply(system=[], messages=[], max_tokens=50)
    assert len(anthropic_server.requests) == 1


async def test_slow_response_times_out(anthropic_server: AnthropicFake) -> None:
    client = client_for(anthropic_server, max_retries=1, timeout=0.3)
    anthropic_server.enqueue(Delay(1.0, Text("late")), Delay(1.0, Text("late")))
    try:
        with pytest.raises(LLMError, match=r"within 0.3s \(timeout\)"):
            await client.reply(system=[], messages=HELLO, max_tokens=50)
    finally:
        await client.aclose()
    assert len(anthropic_server.requests) == 2  # the SDK retried the timeout once


async def test_unreachable_server_is_a_connection_error() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    client = AnthropicLLM(api_key=FAKE_API_KEY, base_url=f"http://127.0.0.1:{port}", max_retries=0)
    try:
        with pytest.raises(LLMError, match="could not connect"):
            await client.reply(system=[], messages=HELLO, max_tokens=50)
    finally:
        await client.aclose()


async def test_concurrency_cap_limits_requests_in_flight(anthropic_server: AnthropicFake) -> None:
    anthropic_server.latency = 0.2
    client = client_for(anthropic_server, max_concurrency=2)
    try:
        results = await asyncio.gather(
            *(
                client.reply(
                    system=[], messages=[ChatTurn(role="user", content=f"m{i}")], max_tokens=20
                )
                for i in range(5)
            )
        )
    finally:
        await client.aclose()
    assert sorted(r.text for r in results) == [f"[reply] m{i}" for i in range(5)]
    assert anthropic_server.max_in_flight == 2  # capped, and the cap was actually used


async def test_configured_key_is_sent(
    anthropic_server: AnthropicFake,
    llm: AnthropicLLM,
) -> None:
    await llm.reply(system=[], messages=HELLO, max_tokens=50)
    request = anthropic_server.requests[0]
    assert request.api_key == FAKE_API_KEY
    assert (
        request.headers.get("authorization") == f"Bearer {FAKE_API_KEY}"
        or request.headers.get("x-api-key") == FAKE_API_KEY
    )
    assert request.headers.get("anthropic-version")


def test_missing_key_fails_at_construction() -> None:
    with pytest.raises(ValueError, match="API key"):
        AnthropicLLM(api_key="", base_url="http://127.0.0.1:9")


async def test_default_model_is_current_and_warning_free(
    anthropic_server: AnthropicFake,
    llm: AnthropicLLM,
) -> None:
    known = typing.get_args(typing.get_args(anthropic.types.Model)[0])
    assert DEFAULT_MODEL in known
    assert DEFAULT_MODEL not in DEPRECATED_MODELS
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        await llm.reply(system=[], messages=HELLO, max_tokens=50)
        clean = list(caught)
        # Control: the same capture does see the SDK's warning for a deprecated model.
        await llm.reply(
            system=[], messages=HELLO, max_tokens=50, model=next(iter(DEPRECATED_MODELS))
        )
    assert clean == []
    assert any(issubclass(w.category, DeprecationWarning) for w in caught)
    assert anthropic_server.requests[0].body["model"] == DEFAULT_MODEL
