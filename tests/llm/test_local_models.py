"""The LLM layer hardened for models on the operator's own machine (issue 24).

Each fault a real 135M model exposed gets a check here against the loopback fakes
(the real-model tier, tests/real_model, checks the same against llama.cpp itself):
the forced call in a shape llama.cpp takes (fault 3), the level remembered across
restarts (fault 3), a capped output and repetition controls (fault 2), and the longer
timeout of a local endpoint, named by the start-up check (fault 4). Fault 1, the
bounded ESS schema, is in tests/engine/test_ess.py.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from app.preflight import check_models
from app.wiring import build_llm
from bot.settings import LOCAL_MODEL_OPTIONS, Settings
from providers import LOCAL_TIMEOUT_SECONDS, is_local_endpoint
from providers.anthropic import AnthropicLLM
from providers.openai import OpenAILLM
from sonality.llm import LLMError
from tests.fakes.anthropic_fixtures import client_for
from tests.fakes.anthropic_server import AnthropicFake
from tests.fakes.openai_fixtures import FAKE_OPENAI_KEY, openai_server
from tests.fakes.openai_server import OpenAIFake, Text, ToolUse
from tests.llm.test_openai_llm import ESS_ANSWER, ESS_TOOL, HELLO, TOOL, call_ess, teach_nuclear

LOCAL_MODEL = "llama3.1:8b"
__all__ = ["openai_server"]  # this folder's conftest opts into the Anthropic fixtures only


@pytest_asyncio.fixture
async def llama_cpp() -> AsyncIterator[OpenAIFake]:
    """The fake playing llama.cpp's server with a model whose template calls tools."""
    async with OpenAIFake(llama_cpp=True) as server:
        yield server


def local_client(server: OpenAIFake, **overrides: Any) -> OpenAILLM:
    options: dict[str, Any] = {
        "api_key": "",
        "base_url": server.base_url,
        "default_model": LOCAL_MODEL,
        "max_retries": 0,
        "timeout": 5.0,
        **overrides,
    }
    return OpenAILLM(**options)


def local_settings(tmp_path: Path, **values: str | None) -> Settings:
    """Settings read from the environment, as the bot reads them (JSON values parsed
    the same way); None leaves a variable unset."""
    env: dict[str, str | None] = {
        "SONALITY_LLM_PROVIDER": "openai",
        "OPENAI_BASE_URL": "http://127.0.0.1:8080/v1",
        "SONALITY_DATA_DIR": str(tmp_path / "data"),
        **values,
    }
    with pytest.MonkeyPatch.context() as patch:
        for name in os.environ:
            if name.startswith(("SONALITY_", "OPENAI_", "ANTHROPIC_")):
                patch.delenv(name)
        for name, value in env.items():
            if value is not None:
                patch.setenv(name, value)
        return Settings(_env_file=None)  # type: ignore[call-arg]


# --- fault 3: the forced call, and the level each model needed --------------------------


async def test_the_forced_call_is_sent_in_a_shape_llama_cpp_takes(llama_cpp: OpenAIFake) -> None:
    """llama.cpp reads a `tool_choice` object as "auto", so the model answered in prose
    and every start spent a call before stepping down; "required" forces the one tool."""
    llama_cpp.enqueue(ToolUse({"score": 0.7, "label": "solid"}))
    client = local_client(llama_cpp)
    try:
        result = await client.call_tool(system=[], messages=HELLO, tool=TOOL, max_tokens=200)
    finally:
        await client.aclose()
    assert result.tool_input == {"score": 0.7, "label": "solid"}
    (request,) = llama_cpp.chat_requests
    assert request.body["tool_choice"] == "required"


async def test_the_level_a_model_needed_is_remembered_across_restarts(tmp_path: Path) -> None:
    """A model whose chat template has no tools answers the forced call in prose; the
    next process starts at the level that worked instead of finding that out again."""
    levels = tmp_path / "data" / "llm_levels.json"
    async with OpenAIFake(llama_cpp=True, ignores_tool_choice=True) as server:
        teach_nuclear(server)
        for _process in range(2):
            client = local_client(server, levels_file=levels)
            try:
                assert await call_ess(client, "Nuclear data: 0.03 deaths/TWh") == ESS_ANSWER
            finally:
                await client.aclose()
        assert [r.structure for r in server.chat_requests] == [
            "tool",
            "response_format",
            "response_format",  # the second process: no wasted call
        ]
        assert json.loads(levels.read_text()) == {server.base_url: {LOCAL_MODEL: 2}}
        # Another model at the same endpoint, or the same model elsewhere, starts afresh.
        other = local_client(server, levels_file=levels, default_model="qwen2.5:7b")
        try:
            await call_ess(other, "Nuclear data")
        finally:
            await other.aclose()
        assert [r.structure for r in server.chat_requests[3:]] == ["tool", "response_format"]


async def test_a_damaged_levels_file_is_learnt_again(tmp_path: Path) -> None:
    levels = tmp_path / "llm_levels.json"
    levels.write_text("{not json")
    async with OpenAIFake(llama_cpp=True, ignores_tool_choice=True) as server:
        teach_nuclear(server)
        client = local_client(server, levels_file=levels)
        try:
            assert await call_ess(client, "Nuclear data") == ESS_ANSWER
        finally:
            await client.aclose()
    assert json.loads(levels.read_text()) == {server.base_url: {LOCAL_MODEL: 2}}


async def test_json_cut_off_at_the_token_limit_does_not_step_down(llama_cpp: OpenAIFake) -> None:
    """An answer that ran out of tokens part-way through the JSON shows the level works:
    the caller retries, and the next call is still a forced function call."""
    llama_cpp.enqueue(ToolUse(ESS_ANSWER), ToolUse(ESS_ANSWER))
    client = local_client(llama_cpp)
    try:
        cut = await client.call_tool(system=[], messages=HELLO, tool=ESS_TOOL, max_tokens=10)
        whole = await client.call_tool(system=[], messages=HELLO, tool=ESS_TOOL, max_tokens=300)
    finally:
        await client.aclose()
    assert cut.tool_input == {} and whole.tool_input == ESS_ANSWER
    assert llama_cpp.responses[0]["choices"][0]["finish_reason"] == "length"
    assert [r.structure for r in llama_cpp.chat_requests] == ["tool", "tool"]


async def test_prose_cut_off_at_the_token_limit_steps_down(tmp_path: Path) -> None:
    """Prose that ran to the limit is a server that ignored the tool: that level failed."""
    async with OpenAIFake(llama_cpp=True, ignores_tool_choice=True) as server:
        server.enqueue(Text("I would say that " * 60), ToolUse(ESS_ANSWER))
        client = local_client(server)
        try:
            result = await client.call_tool(
                system=[], messages=HELLO, tool=ESS_TOOL, max_tokens=100
            )
        finally:
            await client.aclose()
    assert result.tool_input == ESS_ANSWER
    assert server.responses[0]["choices"][0]["finish_reason"] == "length"
    assert [r.structure for r in server.chat_requests] == ["tool", "response_format"]


# --- fault 2: capped output and repetition controls ---------------------------------------


async def test_each_role_asks_for_at_most_its_cap(llama_cpp: OpenAIFake) -> None:
    """A reply that loops runs to its `max_tokens`: the operator's cap bounds it."""
    caps = {"reply": 64, "ess": 1000}
    client = local_client(llama_cpp, output_cap=caps.get)
    try:
        await client.reply(system=[], messages=HELLO, max_tokens=2048, purpose="reply")
        await client.call_tool(system=[], messages=HELLO, tool=TOOL, max_tokens=300, purpose="ess")
        await client.reply(system=[], messages=HELLO, max_tokens=200, purpose="insight")
    finally:
        await client.aclose()
    assert [r.body["max_tokens"] for r in llama_cpp.chat_requests] == [64, 300, 200]


async def test_the_anthropic_client_applies_the_cap_too(anthropic_server: AnthropicFake) -> None:
    client: AnthropicLLM = client_for(anthropic_server, output_cap={"reply": 100}.get)
    try:
        await client.reply(system=[], messages=HELLO, max_tokens=2048, purpose="reply")
        await client.call_tool(system=[], messages=HELLO, tool=TOOL, max_tokens=300, purpose="ess")
    finally:
        await client.aclose()
    assert [r.body["max_tokens"] for r in anthropic_server.requests] == [100, 300]


async def test_model_options_go_into_every_request_to_that_model(llama_cpp: OpenAIFake) -> None:
    options = {LOCAL_MODEL: {"repeat_penalty": 1.15}, "*": {"frequency_penalty": 0.5}}
    client = local_client(llama_cpp, model_options=options)
    try:
        await client.reply(system=[], messages=HELLO, max_tokens=50)
        await client.call_tool(system=[], messages=HELLO, tool=TOOL, max_tokens=50)
        await client.reply(system=[], messages=HELLO, max_tokens=50, model="qwen2.5:7b")
        await client.reply(system=[], messages=HELLO, max_tokens=50, on_text=_ignore)
    finally:
        await client.aclose()
    sent = [
        {k: r.body.get(k) for k in ("repeat_penalty", "frequency_penalty")}
        for r in llama_cpp.chat_requests
    ]
    assert sent == [
        {"repeat_penalty": 1.15, "frequency_penalty": None},
        {"repeat_penalty": 1.15, "frequency_penalty": None},
        {"repeat_penalty": None, "frequency_penalty": 0.5},
        {"repeat_penalty": 1.15, "frequency_penalty": None},  # streamed replies too
    ]


async def _ignore(piece: str) -> None:
    del piece


async def test_llama_cpp_fields_are_refused_by_openai_itself(openai_server: OpenAIFake) -> None:
    """Where the endpoint does not take a field, the operator hears so on the first call."""
    client = OpenAILLM(
        api_key=FAKE_OPENAI_KEY,
        base_url=openai_server.base_url,
        default_model="gpt-4.1",
        max_retries=0,
        model_options={"gpt-4.1": {"repeat_penalty": 1.1}},
    )
    try:
        with pytest.raises(LLMError, match="repeat_penalty"):
            await client.reply(system=[], messages=HELLO, max_tokens=50)
    finally:
        await client.aclose()


def test_a_local_endpoint_gets_a_repetition_control_by_default(tmp_path: Path) -> None:
    local = local_settings(tmp_path)
    assert local.resolved_model_options == {"*": LOCAL_MODEL_OPTIONS}
    assert LOCAL_MODEL_OPTIONS["frequency_penalty"] > 0
    hosted = local_settings(tmp_path, OPENAI_BASE_URL=None)
    assert hosted.resolved_model_options == {}
    off = local_settings(tmp_path, SONALITY_MODEL_OPTIONS="{}")
    assert off.resolved_model_options == {}
    mine = local_settings(tmp_path, SONALITY_MODEL_OPTIONS='{"smollm2": {"repeat_penalty": 1.1}}')
    assert mine.resolved_model_options == {"smollm2": {"repeat_penalty": 1.1}}


@pytest.mark.parametrize(
    ("values", "words"),
    [
        ({"SONALITY_MODEL_OPTIONS": '{"m": {"max_tokens": 9}}'}, "max_tokens is set by the bot"),
        (
            {"SONALITY_LLM_PROVIDER": "anthropic", "SONALITY_MODEL_OPTIONS": '{"m": {"x": 1}}'},
            "SONALITY_LLM_PROVIDER=openai only",
        ),
        ({"SONALITY_REPLY_MAX_TOKENS": "0"}, "greater than or equal to 16"),
        ({"SONALITY_EVIDENCE_MAX_TOKENS": "50"}, "greater than or equal to 128"),
    ],
)
def test_settings_refuse_what_would_break_the_calls(
    tmp_path: Path, values: dict[str, str], words: str
) -> None:
    with pytest.raises(ValueError, match=words):
        local_settings(tmp_path, **values)


def test_the_caps_reach_the_client_by_role(tmp_path: Path) -> None:
    settings = local_settings(
        tmp_path,
        SONALITY_REPLY_MAX_TOKENS="300",
        SONALITY_EVIDENCE_MAX_TOKENS="400",
        SONALITY_REFLECTION_MAX_TOKENS="700",
    )
    client = build_llm(settings)
    cap = client._output_cap
    assert cap is not None
    assert [cap(p) for p in ("reply", "ess", "insight", "judge", "reflection")] == [
        300,
        400,
        400,
        400,
        700,
    ]


# --- fault 4: the timeout of a local endpoint ---------------------------------------------


@pytest.mark.parametrize(
    ("url", "local"),
    [
        ("http://127.0.0.1:8080/v1", True),
        ("http://localhost:11434/v1", True),
        ("http://[::1]:8000/v1", True),
        ("http://192.168.1.20:8000/v1", True),
        ("http://10.0.0.5/v1", True),
        ("http://ollama:11434/v1", True),  # a Compose service
        ("http://host.docker.internal:11434/v1", True),
        ("http://gpu-box.local:8000/v1", True),
        ("https://api.openai.com/v1", False),
        ("https://openrouter.ai/api/v1", False),
        ("http://8.8.8.8/v1", False),
        (None, False),
    ],
)
def test_which_endpoints_are_local(url: str | None, local: bool) -> None:
    assert is_local_endpoint(url) is local


def test_a_local_endpoint_waits_longer_by_default(tmp_path: Path) -> None:
    """54 s passed before a 135M model's first token of a 2,400-token prompt on 2 cores:
    the hosted default of 60 s cut such calls off."""
    local = local_settings(tmp_path)
    assert local.llm_timeout == LOCAL_TIMEOUT_SECONDS == 300
    assert build_llm(local)._client.timeout == 300
    assert local_settings(tmp_path, OPENAI_BASE_URL=None).llm_timeout == 60
    chosen = local_settings(tmp_path, SONALITY_LLM_TIMEOUT_SECONDS="90")
    assert build_llm(chosen)._client.timeout == 90


async def test_the_start_up_check_says_which_timeout_is_in_force(
    tmp_path: Path, llama_cpp: OpenAIFake, caplog: pytest.LogCaptureFixture
) -> None:
    settings = local_settings(
        tmp_path,
        OPENAI_BASE_URL=llama_cpp.base_url,
        SONALITY_MODEL=LOCAL_MODEL,
        SONALITY_ESS_MODEL=LOCAL_MODEL,
    )
    with caplog.at_level(logging.INFO, logger="app.preflight"):
        await check_models(settings)
    lines = [r.getMessage() for r in caplog.records if r.name == "app.preflight"]
    assert lines[0] == (
        f"LLM calls time out after 300s (the default for a local endpoint ({llama_cpp.base_url}))"
    )
    # llama.cpp has no model lookup: the model was checked with a 1-token call.
    assert [r.path for r in llama_cpp.requests] == [
        f"/v1/models/{LOCAL_MODEL}",
        "/v1/chat/completions",
    ]
