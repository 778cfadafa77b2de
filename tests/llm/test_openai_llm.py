"""`OpenAILLM` through the real `AsyncOpenAI` client against the loopback fake.

Nothing is mocked or patched: these tests check what goes over the wire (auth header,
one system message, the tool fallback chain, the token-limit parameter), how the SDK's
own retries and timeouts surface as `LLMError`, and that the fake is as strict and as
stingy with its cache as the real API.
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
from collections.abc import AsyncIterator
from typing import Any

import openai
import pytest
import pytest_asyncio

from providers.openai import OpenAILLM, first_json_object
from sonality.ess import classify
from sonality.llm import ChatTurn, LLMError, SystemBlock, Usage
from sonality.store import UsageRecord
from tests.fakes import openai_fixtures
from tests.fakes.openai_fixtures import FAKE_OPENAI_KEY, OPENAI_TEST_MODEL, openai_client_for
from tests.fakes.openai_server import Delay, Fault, OpenAIFake, Text, ToolUse

# This folder's conftest opts into the Anthropic fixtures; these are the OpenAI ones.
openai_server = openai_fixtures.openai_server
openai_llm = openai_fixtures.openai_llm

HELLO = [ChatTurn(role="user", content="Hello there")]
OTHER_MODEL = "gpt-4.1-mini"
TOOL: dict[str, Any] = {
    "name": "rate_it",
    "description": "Rate the message.",
    "input_schema": {
        "type": "object",
        "properties": {"score": {"type": "number"}, "label": {"type": "string"}},
        "required": ["score", "label"],
    },
}
_ENUM = {"type": "string", "enum": ["a", "empirical_data", "peer_reviewed", "supports"]}
# The shape of the engine's ESS tool (inlined: this file tests the client and the fake).
ESS_TOOL: dict[str, Any] = {
    "name": "classify_evidence",
    "description": "Rate the strength of the evidence in the message.",
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
ESS_ANSWER = {
    "score": 0.8,
    "reasoning_type": "empirical_data",
    "source_reliability": "peer_reviewed",
    "internal_consistency": True,
    "novelty": 0.9,
    "topics": ["nuclear_energy"],
    "summary": "Nuclear is safe per data.",
    "opinion_direction": "supports",
}


def ess_turn(message: str) -> list[ChatTurn]:
    # The personality mentions nuclear too: only the <message> section may match.
    prompt = (
        f"Rate the text in <message> tags.\n<message>\n{message}\n</message>\n"
        "<agent_personality>I keep thinking about nuclear power.</agent_personality>"
    )
    return [ChatTurn(role="user", content=prompt)]


def teach_nuclear(server: OpenAIFake) -> None:
    server.brain.ess_rule(
        contains="nuclear",
        score=0.8,
        direction="supports",
        topics=["nuclear_energy"],
        novelty=0.9,
        reasoning_type="empirical_data",
        source_reliability="peer_reviewed",
        summary="Nuclear is safe per data.",
    )


def served_usage(server: OpenAIFake, *responses: int) -> Usage:
    """What the fake reported for the given responses, mapped the documented way."""
    total = Usage()
    for index in responses:
        usage = server.responses[index]["usage"]
        cached = usage["prompt_tokens_details"]["cached_tokens"]
        total += Usage(
            input_tokens=usage["prompt_tokens"] - cached,
            output_tokens=usage["completion_tokens"],
            cache_read_tokens=cached,
        )
    return total


def level_logs(caplog: pytest.LogCaptureFixture, model: str) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == "providers.openai"
        and r.levelno == logging.INFO
        and "structured answers" in r.getMessage()
        and f"model {model} " in r.getMessage()
    ]


@pytest_asyncio.fixture
async def keyless_server() -> AsyncIterator[OpenAIFake]:
    """A server that takes no key, like Ollama."""
    async with OpenAIFake() as server:
        yield server


async def call_ess(client: OpenAILLM, message: str, model: str | None = None) -> dict[str, Any]:
    result = await client.call_tool(
        system=[SystemBlock(text="You rate evidence.")],
        messages=ess_turn(message),
        tool=ESS_TOOL,
        max_tokens=300,
        model=model,
        purpose="ess",
    )
    return result.tool_input


# --- text replies ------------------------------------------------------------------------


async def test_reply_sends_one_system_message_and_maps_usage(
    openai_server: OpenAIFake, openai_llm: OpenAILLM
) -> None:
    openai_server.enqueue(
        Text(
            ["Hello ", "world"],
            usage={"prompt_tokens": 11, "completion_tokens": 7, "cached_tokens": 5},
        )
    )
    result = await openai_llm.reply(
        system=[SystemBlock(text="Be brief.", cache=True), SystemBlock(text="State: calm.")],
        messages=[
            ChatTurn(role="user", content="Earlier", cache=True),
            ChatTurn(role="assistant", content="Noted."),
            *HELLO,
        ],
        max_tokens=50,
    )
    assert result.text == "Hello world"
    assert result.model == OPENAI_TEST_MODEL
    assert result.usage == Usage(
        input_tokens=6, output_tokens=7, cache_read_tokens=5, cache_write_tokens=0
    )
    body = openai_server.requests[0].body
    assert body["model"] == OPENAI_TEST_MODEL
    assert body["max_tokens"] == 50
    assert body["messages"] == [
        {"role": "system", "content": "Be brief.\n\nState: calm."},
        {"role": "user", "content": "Earlier"},
        {"role": "assistant", "content": "Noted."},
        {"role": "user", "content": "Hello there"},
    ]
    # Cache hints stay on our side: OpenAI caches by itself and knows no cache_control.
    assert "cache_control" not in json.dumps(body)
    assert not {"tools", "tool_choice", "response_format", "max_completion_tokens"} & set(body)


@pytest.mark.parametrize(
    "usage",
    [
        {"prompt_tokens_details": None, "completion_tokens_details": None},
        {"cached_tokens": None},
    ],
)
async def test_usage_without_cache_details_counts_nothing_cached(
    openai_server: OpenAIFake, openai_llm: OpenAILLM, usage: dict[str, int | None]
) -> None:
    openai_server.enqueue(Text("ok", usage={"prompt_tokens": 40, "completion_tokens": 3, **usage}))
    result = await openai_llm.reply(system=[], messages=HELLO, max_tokens=20)
    assert result.usage == Usage(input_tokens=40, output_tokens=3)
    assert "system" not in json.dumps(openai_server.requests[0].body["messages"])


async def test_brain_replies_when_nothing_is_scripted(
    openai_server: OpenAIFake, openai_llm: OpenAILLM
) -> None:
    openai_server.brain.reply_rule(contains="REFLECT-MARK", text="reflected!", in_system=True)
    plain = await openai_llm.reply(system=[], messages=HELLO, max_tokens=50)
    scripted = await openai_llm.reply(
        system=[SystemBlock(text="REFLECT-MARK")], messages=HELLO, max_tokens=50
    )
    assert plain.text == "[reply] Hello there"
    assert scripted.text == "reflected!"
    assert openai_server.requests[1].system_text == "REFLECT-MARK"
    assert openai_server.requests[1].last_user_text == "Hello there"


# --- the tool chain ----------------------------------------------------------------------


async def test_call_tool_forces_the_function_and_returns_its_arguments(
    openai_server: OpenAIFake, openai_llm: OpenAILLM, caplog: pytest.LogCaptureFixture
) -> None:
    openai_server.enqueue(ToolUse({"score": 0.7, "label": "solid"}))
    with caplog.at_level(logging.INFO, logger="providers.openai"):
        result = await openai_llm.call_tool(system=[], messages=HELLO, tool=TOOL, max_tokens=200)
    assert result.tool_input == {"score": 0.7, "label": "solid"}
    assert result.usage == served_usage(openai_server, 0)
    body = openai_server.requests[0].body
    assert body["tools"] == [
        {
            "type": "function",
            "function": {
                "name": "rate_it",
                "description": "Rate the message.",
                "parameters": TOOL["input_schema"],
            },
        }
    ]
    # With one tool, "required" forces it; llama.cpp takes no object here.
    assert body["tool_choice"] == "required"
    assert openai_server.requests[0].tool_name == "rate_it"
    assert len(level_logs(caplog, OPENAI_TEST_MODEL)) == 1


@pytest.mark.parametrize("quirk", ["ignores_tool_choice", "malformed_arguments", "rejects_tools"])
async def test_a_model_without_working_tool_calls_answers_through_response_format(
    openai_server: OpenAIFake,
    openai_llm: OpenAILLM,
    caplog: pytest.LogCaptureFixture,
    quirk: str,
) -> None:
    setattr(openai_server, quirk, True)
    teach_nuclear(openai_server)
    with caplog.at_level(logging.INFO, logger="providers.openai"):
        first = await call_ess(openai_llm, "Nuclear data: 0.03 deaths/TWh")
        again = await call_ess(openai_llm, "Nuclear again")
        third = await call_ess(openai_llm, "hello all")
    assert first == ESS_ANSWER
    assert again["score"] == 0.8
    assert third["score"] == 0.02 and third["reasoning_type"] == "no_argument"
    structures = [r.structure for r in openai_server.requests]
    # Level 1 once, then the model starts at level 2.
    assert structures == ["tool", "response_format", "response_format", "response_format"]
    sent = openai_server.requests[1].body["response_format"]
    assert sent == {
        "type": "json_schema",
        "json_schema": {
            "name": "classify_evidence",
            "schema": ESS_TOOL["input_schema"],
            "description": ESS_TOOL["description"],
        },
    }
    assert "tools" not in openai_server.requests[1].body
    [logged] = level_logs(caplog, OPENAI_TEST_MODEL)
    assert "level 2" in logged
    # Nothing went wrong from the operator's point of view: no warnings.
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


async def test_the_remembered_level_is_per_model(
    openai_server: OpenAIFake, openai_llm: OpenAILLM
) -> None:
    openai_server.ignores_tool_choice = True
    teach_nuclear(openai_server)
    await call_ess(openai_llm, "Nuclear data")
    assert await call_ess(openai_llm, "Nuclear data", model=OTHER_MODEL) == ESS_ANSWER
    assert [(r.body["model"], r.structure) for r in openai_server.requests] == [
        (OPENAI_TEST_MODEL, "tool"),
        (OPENAI_TEST_MODEL, "response_format"),
        (OTHER_MODEL, "tool"),
        (OTHER_MODEL, "response_format"),
    ]


async def test_usage_of_every_call_in_the_chain_is_summed(
    openai_server: OpenAIFake, openai_llm: OpenAILLM
) -> None:
    openai_server.ignores_tool_choice = True
    teach_nuclear(openai_server)
    result = await openai_llm.call_tool(
        system=[], messages=ess_turn("Nuclear data"), tool=ESS_TOOL, max_tokens=300
    )
    assert len(openai_server.responses) == 2
    assert result.usage == served_usage(openai_server, 0, 1)
    assert result.usage.output_tokens > served_usage(openai_server, 1).output_tokens


@pytest.mark.parametrize("quirk", ["ignores_tool_choice", "malformed_arguments", "rejects_tools"])
async def test_without_response_format_the_answer_comes_as_json_in_text(
    openai_server: OpenAIFake,
    openai_llm: OpenAILLM,
    caplog: pytest.LogCaptureFixture,
    quirk: str,
) -> None:
    setattr(openai_server, quirk, True)
    openai_server.supports_response_format = False
    teach_nuclear(openai_server)
    with caplog.at_level(logging.INFO, logger="providers.openai"):
        first = await call_ess(openai_llm, "Nuclear data: 0.03 deaths/TWh")
        second = await call_ess(openai_llm, "Nuclear again")
    assert first == ESS_ANSWER
    assert second["opinion_direction"] == "supports"
    assert [r.structure for r in openai_server.requests] == [
        "tool",
        "response_format",
        "instruction",
        "instruction",
    ]
    last = openai_server.requests[-1]
    assert not {"tools", "tool_choice", "response_format"} & set(last.body)
    # One system message: the caller's prompt, then the instruction naming every field.
    [system] = [m for m in last.body["messages"] if m["role"] == "system"]
    assert system["content"].startswith("You rate evidence.\n\n")
    for field in ESS_TOOL["input_schema"]["properties"]:
        assert f"- {field} (" in system["content"]
    # The fake answers like a small local model: a fenced block after a preface.
    reply = openai_server.responses[-1]["choices"][0]["message"]["content"]
    assert reply.startswith("Here is the JSON") and "```json" in reply
    [logged] = level_logs(caplog, OPENAI_TEST_MODEL)
    assert "level 3" in logged


async def test_when_no_level_gives_json_the_input_is_empty_and_nothing_is_remembered(
    openai_server: OpenAIFake, openai_llm: OpenAILLM, caplog: pytest.LogCaptureFixture
) -> None:
    openai_server.enqueue(Text("I'd rather chat."), Text("Still chatting."), Text("No JSON."))
    with caplog.at_level(logging.INFO, logger="providers.openai"):
        result = await openai_llm.call_tool(system=[], messages=HELLO, tool=TOOL, max_tokens=200)
    assert result.tool_input == {}
    assert result.usage == served_usage(openai_server, 0, 1, 2)
    assert level_logs(caplog, OPENAI_TEST_MODEL) == []
    # The next call starts over with the forced function call, which now works.
    again = await openai_llm.call_tool(system=[], messages=HELLO, tool=TOOL, max_tokens=200)
    assert again.tool_input == {"score": 0.0, "label": ""}
    assert [r.structure for r in openai_server.requests] == [
        "tool",
        "response_format",
        "instruction",
        "tool",
    ]


async def test_a_json_array_is_not_an_answer(
    openai_server: OpenAIFake, openai_llm: OpenAILLM
) -> None:
    openai_server.enqueue(
        Text("[1, 2]"), Text('["score", 0.5]'), Text('{"score": 0.5, "label": "x"}')
    )
    result = await openai_llm.call_tool(system=[], messages=HELLO, tool=TOOL, max_tokens=200)
    assert result.tool_input == {"score": 0.5, "label": "x"}
    assert len(openai_server.requests) == 3


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('{"a": 1}', {"a": 1}),
        ('Sure!\n```json\n{"a": {"b": [1, 2]}}\n```\nAnything else?', {"a": {"b": [1, 2]}}),
        ('[1, 2] then {"a": "}"}', {"a": "}"}),
        ('{not json} but {"a": true}', {"a": True}),
        ("no object here", None),
        ('{"a": 1', None),
    ],
)
def test_first_json_object_finds_the_object_in_prose_and_fences(
    text: str, expected: dict[str, Any] | None
) -> None:
    assert first_json_object(text) == expected


#: A local model looping on brackets until its token cap: Python's JSON parser gives up
#: on such nesting with RecursionError, not ValueError.
BRACKET_LOOP = '{"score": 0.4, "topics": ' + "[" * 1500


async def test_a_model_looping_on_brackets_gives_an_empty_input_not_an_error(
    openai_server: OpenAIFake, openai_llm: OpenAILLM
) -> None:
    """Whatever level asked it: no JSON object, so the caller gets no input (ESS then
    falls back to its defaults) rather than an error, and every answer's usage counts."""
    assert first_json_object(BRACKET_LOOP) is None
    openai_server.enqueue(Text(BRACKET_LOOP), Text(BRACKET_LOOP), Text(BRACKET_LOOP))
    result = await openai_llm.call_tool(system=[], messages=HELLO, tool=TOOL, max_tokens=200)
    assert result.tool_input == {}
    served = range(len(openai_server.responses))
    assert len(served) >= 1 and result.usage == served_usage(openai_server, *served)


async def test_a_client_bug_is_not_mistaken_for_a_missing_feature(
    openai_server: OpenAIFake, openai_llm: OpenAILLM
) -> None:
    """A 400 about something else than tools is raised, not papered over by level 2."""
    with pytest.raises(LLMError, match=r"rejected the request \(400: Invalid 'messages'"):
        await openai_llm.call_tool(system=[], messages=[], tool=TOOL, max_tokens=200)
    assert len(openai_server.requests) == 1


# --- max_tokens or max_completion_tokens -------------------------------------------------


async def test_a_model_refusing_max_tokens_gets_max_completion_tokens_from_then_on(
    openai_server: OpenAIFake, openai_llm: OpenAILLM
) -> None:
    openai_server.rejects_max_tokens = True
    first = await openai_llm.reply(system=[], messages=HELLO, max_tokens=64)
    second = await openai_llm.call_tool(system=[], messages=HELLO, tool=TOOL, max_tokens=32)
    other = await openai_llm.reply(system=[], messages=HELLO, max_tokens=16, model=OTHER_MODEL)
    assert first.text == "[reply] Hello there"
    assert second.tool_input == {"score": 0.0, "label": ""}
    assert other.text == "[reply] Hello there"
    limits = [
        (r.body["model"], r.body.get("max_tokens"), r.body.get("max_completion_tokens"))
        for r in openai_server.requests
    ]
    assert limits == [
        (OPENAI_TEST_MODEL, 64, None),
        (OPENAI_TEST_MODEL, None, 64),
        (OPENAI_TEST_MODEL, None, 32),
        (OTHER_MODEL, 16, None),
        (OTHER_MODEL, None, 16),
    ]


# --- faults ------------------------------------------------------------------------------


async def test_429_is_retried_by_the_sdk(openai_server: OpenAIFake, openai_llm: OpenAILLM) -> None:
    openai_server.enqueue(Fault(status=429, retry_after_ms=10), Text("finally"))
    result = await openai_llm.reply(system=[], messages=HELLO, max_tokens=50)
    assert result.text == "finally"
    retry_counts = [r.headers.get("x-stainless-retry-count") for r in openai_server.requests]
    assert retry_counts == ["0", "1"]


async def test_a_retry_after_beyond_what_the_sdk_waits_is_reported_not_slept(
    openai_server: OpenAIFake, openai_llm: OpenAILLM
) -> None:
    """The SDK reads retry-after and refuses to sleep ten minutes; the engine learns
    when to come back from `LLMError.retry_after`."""
    openai_server.enqueue(Fault(status=429, retry_after_ms=600_000), Text("too late"))
    with pytest.raises(LLMError, match=r"rate limited by the OpenAI-compatible API") as caught:
        await openai_llm.reply(system=[], messages=HELLO, max_tokens=50)
    assert caught.value.retry_after == 600.0
    assert isinstance(caught.value.__cause__, openai.RateLimitError)
    assert len(openai_server.requests) == 1


async def test_429_after_all_retries_carries_retry_after(
    openai_server: OpenAIFake, openai_llm: OpenAILLM
) -> None:
    openai_server.enqueue(*[Fault(status=429, retry_after_ms=20)] * 3)
    with pytest.raises(LLMError, match=r"\(429\) after 2 retries") as caught:
        await openai_llm.reply(system=[], messages=HELLO, max_tokens=50)
    assert caught.value.retry_after == 0.02
    assert len(openai_server.requests) == 3


async def test_500_three_times_exhausts_retries(
    openai_server: OpenAIFake, openai_llm: OpenAILLM, caplog: pytest.LogCaptureFixture
) -> None:
    openai_server.enqueue(*[Fault(status=500, retry_after_ms=10)] * 3, Text("too late"))
    with caplog.at_level(logging.WARNING, logger="providers.openai"):
        with pytest.raises(LLMError, match=r"failed with status 500 after 2 retries") as caught:
            await openai_llm.reply(system=[], messages=HELLO, max_tokens=50, purpose="reflection")
    assert isinstance(caught.value.__cause__, openai.InternalServerError)
    assert caught.value.retry_after is None
    assert len(openai_server.requests) == 3
    assert openai_server.script_left == 1
    [record] = [r for r in caplog.records if r.name == "providers.openai"]
    assert record.levelno == logging.WARNING and "reflection" in record.getMessage()


async def test_a_fault_during_the_tool_chain_is_an_error_not_a_fallback(
    openai_server: OpenAIFake,
) -> None:
    client = openai_client_for(openai_server, max_retries=0)
    openai_server.enqueue(Fault(status=503))
    try:
        with pytest.raises(LLMError, match="status 503"):
            await client.call_tool(system=[], messages=HELLO, tool=TOOL, max_tokens=200)
    finally:
        await client.aclose()
    assert [r.structure for r in openai_server.requests] == ["tool"]


async def test_a_fault_after_a_level_that_answered_carries_what_it_cost(
    openai_server: OpenAIFake,
) -> None:
    """The forced call answered in prose (no JSON: the next level is tried), then the
    server failed: the error carries the first answer's usage, and the ESS records it,
    so the spending limit counts a call that was paid for."""
    client = openai_client_for(openai_server, max_retries=0)
    openai_server.enqueue(Text("I'd rather chat."), Fault(status=503))
    spent: list[UsageRecord] = []
    try:
        with pytest.raises(LLMError, match="status 503") as caught:
            await classify(client, "The survey of 40 trials says so.", "", usage_sink=spent)
    finally:
        await client.aclose()
    first = served_usage(openai_server, 0)
    assert first.input_tokens > 0
    assert caught.value.spent is not None and caught.value.spent.usage == first
    assert [(r.purpose, r.usage) for r in spent] == [("ess", first)]


async def test_slow_response_times_out(openai_server: OpenAIFake) -> None:
    client = openai_client_for(openai_server, max_retries=1, timeout=0.3)
    openai_server.enqueue(Delay(1.0, Text("late")), Delay(1.0, Text("late")))
    try:
        with pytest.raises(LLMError, match=r"within 0.3s \(timeout\) after 1 retries"):
            await client.reply(system=[], messages=HELLO, max_tokens=50)
    finally:
        await client.aclose()
    assert len(openai_server.requests) == 2  # the SDK retried the timeout once


async def test_unreachable_server_is_a_connection_error() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    client = OpenAILLM(api_key="k", base_url=f"http://127.0.0.1:{port}/v1", max_retries=0)
    try:
        with pytest.raises(
            LLMError, match=rf"could not connect to .*127.0.0.1:{port}/v1 \(connection refused\)"
        ):
            await client.reply(system=[], messages=HELLO, max_tokens=50)
    finally:
        await client.aclose()


async def test_an_unknown_model_is_named(openai_server: OpenAIFake, openai_llm: OpenAILLM) -> None:
    with pytest.raises(LLMError, match=r"404: The model `gpt-9` does not exist"):
        await openai_llm.reply(system=[], messages=HELLO, max_tokens=50, model="gpt-9")
    assert len(openai_server.requests) == 1


# --- keys --------------------------------------------------------------------------------


@pytest.mark.parametrize("key", ["", None])
async def test_no_key_works_against_a_keyless_server(
    keyless_server: OpenAIFake, monkeypatch: pytest.MonkeyPatch, key: str | None
) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    client = OpenAILLM(api_key=key, base_url=keyless_server.base_url, default_model="llama3.1:8b")
    try:
        result = await client.reply(system=[], messages=HELLO, max_tokens=20)
        tool = await client.call_tool(system=[], messages=HELLO, tool=TOOL, max_tokens=20)
    finally:
        await client.aclose()
    assert result.text == "[reply] Hello there"
    assert tool.tool_input == {"score": 0.0, "label": ""}
    assert all("authorization" not in r.headers for r in keyless_server.requests)
    assert len(keyless_server.requests) == 2


async def test_no_key_against_a_server_that_wants_one_says_so(openai_server: OpenAIFake) -> None:
    client = openai_client_for(openai_server, api_key="")
    try:
        with pytest.raises(LLMError, match=r"wants an API key \(401\): set OPENAI_API_KEY"):
            await client.reply(system=[], messages=HELLO, max_tokens=20)
    finally:
        await client.aclose()
    assert openai_server.requests[0].api_key is None


async def test_a_wrong_key_is_named_and_not_retried(openai_server: OpenAIFake) -> None:
    client = openai_client_for(openai_server, api_key="sk-wrong-key-123")
    try:
        with pytest.raises(
            LLMError, match=r"API key in OPENAI_API_KEY was rejected .* \(401 invalid_api_key\)"
        ):
            await client.reply(system=[], messages=HELLO, max_tokens=20)
    finally:
        await client.aclose()
    assert len(openai_server.requests) == 1


async def test_the_key_is_sent_as_bearer(openai_server: OpenAIFake, openai_llm: OpenAILLM) -> None:
    await openai_llm.reply(system=[], messages=HELLO, max_tokens=20)
    assert openai_server.requests[0].headers["authorization"] == f"Bearer {FAKE_OPENAI_KEY}"


# --- caching -----------------------------------------------------------------------------

LONG_SYSTEM = [SystemBlock(text="You are a community personality. " * 200)]  # ~1,650 tokens


async def test_a_short_prompt_is_never_cached(
    openai_server: OpenAIFake, openai_llm: OpenAILLM
) -> None:
    system = [SystemBlock(text="static identity " * 200)]  # ~800 tokens, under 1,024
    first = await openai_llm.reply(system=system, messages=HELLO, max_tokens=20)
    second = await openai_llm.reply(system=system, messages=HELLO, max_tokens=20)
    assert first.usage.cache_read_tokens == second.usage.cache_read_tokens == 0
    assert second.usage.input_tokens == first.usage.input_tokens < 1024


async def test_a_repeated_long_prefix_is_cached_in_128_token_steps(
    openai_server: OpenAIFake, openai_llm: OpenAILLM
) -> None:
    first = await openai_llm.reply(system=LONG_SYSTEM, messages=HELLO, max_tokens=20)
    second = await openai_llm.reply(
        system=LONG_SYSTEM, messages=[ChatTurn(role="user", content="Another one")], max_tokens=20
    )
    other_model = await openai_llm.reply(
        system=LONG_SYSTEM, messages=HELLO, max_tokens=20, model=OTHER_MODEL
    )
    assert first.usage.cache_read_tokens == 0
    cached = second.usage.cache_read_tokens
    shared_tokens = len("You are a community personality. " * 200) // 4
    assert cached >= 1024 and (cached - 1024) % 128 == 0
    assert shared_tokens - 128 < cached <= shared_tokens
    prompt_tokens = openai_server.responses[1]["usage"]["prompt_tokens"]
    assert second.usage.input_tokens == prompt_tokens - cached
    assert other_model.usage.cache_read_tokens == 0  # caches are per model


async def test_a_long_prompt_sharing_under_1024_tokens_gets_nothing_cached(
    openai_server: OpenAIFake, openai_llm: OpenAILLM
) -> None:
    await openai_llm.reply(system=LONG_SYSTEM, messages=HELLO, max_tokens=20)
    changed = [SystemBlock(text="X" + LONG_SYSTEM[0].text)]  # differs at the very start
    result = await openai_llm.reply(system=changed, messages=HELLO, max_tokens=20)
    assert result.usage.cache_read_tokens == 0
    assert result.usage.input_tokens > 1024


async def test_a_cached_prefix_expires_after_five_idle_minutes(
    openai_server: OpenAIFake, openai_llm: OpenAILLM
) -> None:
    now = [0.0]
    openai_server.clock = lambda: now[0]

    async def cached_after(seconds: float, text: str) -> int:
        now[0] += seconds
        turn = [ChatTurn(role="user", content=text)]
        result = await openai_llm.reply(system=LONG_SYSTEM, messages=turn, max_tokens=20)
        return result.usage.cache_read_tokens

    assert await cached_after(0, "one") == 0
    assert await cached_after(299, "two") > 0  # alive, and the hit keeps it alive
    assert await cached_after(299, "three") > 0
    assert await cached_after(301, "four") == 0  # five idle minutes: gone


# --- concurrency -------------------------------------------------------------------------


async def test_concurrency_cap_limits_requests_in_flight(openai_server: OpenAIFake) -> None:
    openai_server.gate = asyncio.Event()
    client = openai_client_for(openai_server, max_concurrency=2)
    try:
        calls = [
            asyncio.create_task(
                client.reply(
                    system=[], messages=[ChatTurn(role="user", content=f"m{i}")], max_tokens=20
                )
            )
            for i in range(5)
        ]
        await openai_server.wait_for_requests(2)
        # Held at the gate: with the cap reached, no third request may even be sent.
        for _ in range(20):
            await asyncio.sleep(0)
        assert len(openai_server.requests) == 2
        openai_server.gate.set()
        results = await asyncio.gather(*calls)
    finally:
        await client.aclose()
    assert sorted(r.text for r in results) == [f"[reply] m{i}" for i in range(5)]
    assert openai_server.max_in_flight == 2


# --- the model check ---------------------------------------------------------------------


async def test_check_model_asks_the_models_api(
    openai_server: OpenAIFake, openai_llm: OpenAILLM
) -> None:
    await openai_llm.check_model(OPENAI_TEST_MODEL)
    with pytest.raises(openai.NotFoundError) as caught:
        await openai_llm.check_model("gpt-9")
    assert [r.path for r in openai_server.requests] == [
        f"/v1/models/{OPENAI_TEST_MODEL}",
        "/v1/models/gpt-9",
    ]
    assert caught.value.code == "model_not_found"


async def test_check_model_without_a_models_api_makes_a_one_token_call(
    openai_server: OpenAIFake, openai_llm: OpenAILLM
) -> None:
    openai_server.serves_model_lookup = False
    await openai_llm.check_model(OPENAI_TEST_MODEL)
    with pytest.raises(openai.NotFoundError):
        await openai_llm.check_model("gpt-9")
    chats = openai_server.chat_requests
    assert [(r.body["model"], r.body["max_tokens"]) for r in chats] == [
        (OPENAI_TEST_MODEL, 1),
        ("gpt-9", 1),
    ]


async def test_check_model_raises_the_sdk_error_for_a_wrong_key(openai_server: OpenAIFake) -> None:
    client = openai_client_for(openai_server, api_key="sk-wrong-key-123")
    try:
        with pytest.raises(openai.AuthenticationError):
            await client.check_model(OPENAI_TEST_MODEL)
    finally:
        await client.aclose()


# --- the fake is as strict as the API ----------------------------------------------------


@pytest.mark.parametrize(
    ("extra", "param", "code"),
    [
        ({"messages": []}, "messages", "empty_array"),
        ({"messages": [{"role": "bot", "content": "hi"}]}, "messages[0].role", "invalid_value"),
        ({"messages": [{"role": "user"}]}, "messages[0].content", "missing_required_parameter"),
        ({"max_tokens": 0}, "max_tokens", "integer_below_min_value"),
        ({"tool_choice": "required"}, "tool_choice", None),
        (
            {
                "tools": [{"type": "function", "function": {"name": "a"}}],
                "tool_choice": {"type": "function", "function": {"name": "b"}},
            },
            "tool_choice",
            None,
        ),
        (
            {"tools": [{"type": "function", "function": {"name": "bad name"}}]},
            "tools[0].function.name",
            "invalid_value",
        ),
        ({"response_format": {"type": "json_object"}}, "messages", None),
        (
            {"response_format": {"type": "json_schema"}},
            "response_format.json_schema",
            "missing_required_parameter",
        ),
        (
            {"tools": [{"type": "function", "function": {"name": "a", "parameters": {}}}]},
            "tools[0].function.parameters",
            "invalid_function_parameters",
        ),
        ({"temperature": 0.2, "cache_control": {"type": "ephemeral"}}, None, None),
        (
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {
                        "name": "x",
                        "strict": True,
                        "schema": {"type": "object", "properties": {"a": {"type": "string"}}},
                    },
                }
            },
            "response_format",
            "invalid_json_schema",
        ),
    ],
)
async def test_the_fake_rejects_what_openai_rejects(
    openai_server: OpenAIFake, extra: dict[str, Any], param: str | None, code: str | None
) -> None:
    async with openai.AsyncOpenAI(
        api_key=FAKE_OPENAI_KEY, base_url=openai_server.base_url, max_retries=0
    ) as client:
        with pytest.raises(openai.BadRequestError) as caught:
            # extra_body: the SDK itself would refuse some of these before sending.
            await client.chat.completions.create(
                model=OPENAI_TEST_MODEL,
                messages=[{"role": "user", "content": "hi"}],
                extra_body=extra,
            )
    error = caught.value
    assert error.status_code == 400
    assert error.param == param and error.code == code
    assert error.type == "invalid_request_error"
    assert openai_server.script_left == 0 and openai_server.responses == []


async def test_the_fake_models_api_lists_and_looks_up(openai_server: OpenAIFake) -> None:
    async with openai.AsyncOpenAI(
        api_key=FAKE_OPENAI_KEY, base_url=openai_server.base_url, max_retries=0
    ) as client:
        listed = [m.id async for m in client.models.list()]
        found = await client.models.retrieve("llama3.1:8b")
        with pytest.raises(openai.NotFoundError) as caught:
            await client.models.retrieve("openai/gpt-9")
    assert OPENAI_TEST_MODEL in listed and sorted(listed) == listed
    assert found.id == "llama3.1:8b"
    assert caught.value.code == "model_not_found" and "openai/gpt-9" in caught.value.message
