"""ESS classification: schema, validation, retries and safe defaults."""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

import pytest

from providers.anthropic import AnthropicLLM
from sonality.config import MAX_ESS_RETRIES
from sonality.ess import (
    ESS_TOOL,
    ESSResult,
    OpinionDirection,
    ReasoningType,
    SourceReliability,
    classify,
    safe_default_ess,
)
from sonality.llm import LLMError
from sonality.store import UsageRecord
from tests.fakes.anthropic_server import AnthropicFake, Fault, ToolUse

VALID: dict[str, Any] = {
    "score": 0.62,
    "reasoning_type": "empirical_data",
    "source_reliability": "peer_reviewed",
    "internal_consistency": True,
    "novelty": 0.4,
    "topics": ["Nuclear Energy", "grid-stability"],
    "summary": "Cites capacity-factor data to argue nuclear is reliable.",
    "opinion_direction": "supports",
}
# The eight fields the seed's ESS schema and result share, in the seed's order.
SEED_FIELDS = [
    "score",
    "reasoning_type",
    "source_reliability",
    "internal_consistency",
    "novelty",
    "topics",
    "summary",
    "opinion_direction",
]


def test_enum_values_match_seed():
    assert [m.value for m in ReasoningType] == [
        "logical_argument",
        "empirical_data",
        "expert_opinion",
        "anecdotal",
        "social_pressure",
        "emotional_appeal",
        "no_argument",
    ]
    assert [m.value for m in SourceReliability] == [
        "peer_reviewed",
        "established_expert",
        "informed_opinion",
        "casual_observation",
        "unverified_claim",
        "not_applicable",
    ]
    assert [m.value for m in OpinionDirection] == ["supports", "opposes", "neutral"]
    assert [d.sign for d in OpinionDirection] == [1.0, -1.0, 0.0]


def test_tool_schema():
    assert ESS_TOOL["name"] == "classify_evidence"
    schema = ESS_TOOL["input_schema"]
    assert schema["required"] == SEED_FIELDS
    props = schema["properties"]
    assert set(props) == set(schema["required"])
    assert props["reasoning_type"]["enum"] == [m.value for m in ReasoningType]
    assert props["source_reliability"]["enum"] == [m.value for m in SourceReliability]
    assert props["opinion_direction"]["enum"] == ["supports", "opposes", "neutral"]
    assert props["score"]["type"] == "number" and props["novelty"]["type"] == "number"
    assert props["internal_consistency"]["type"] == "boolean"
    assert props["topics"] == {**props["topics"], "type": "array", "items": {"type": "string"}}


def test_result_is_frozen_with_nine_fields():
    result = safe_default_ess("hello")
    assert [f.name for f in dataclasses.fields(ESSResult)] == [*SEED_FIELDS, "used_defaults"]
    with pytest.raises(dataclasses.FrozenInstanceError):
        result.score = 1.0  # type: ignore[misc]


def test_safe_defaults():
    msg = "zebraquokka " * 20
    d = safe_default_ess(msg)
    assert d == ESSResult(
        score=0.0,
        reasoning_type=ReasoningType.NO_ARGUMENT,
        source_reliability=SourceReliability.NOT_APPLICABLE,
        internal_consistency=False,
        novelty=0.0,
        topics=(),
        summary="A message of 20 words that could not be summarised.",
        opinion_direction=OpinionDirection.NEUTRAL,
        used_defaults=True,
    )
    assert "zebraquokka" not in d.summary  # the summary outlives the message: no quote


async def test_an_empty_summary_from_the_model_does_not_quote_the_message(
    anthropic_server: AnthropicFake, llm: AnthropicLLM
):
    anthropic_server.enqueue(ToolUse({**VALID, "summary": "  "}))
    result = await classify(llm, "My secret word is zebraquokka.", "snap")
    assert not result.used_defaults and result.score == VALID["score"]
    assert result.summary == "A message of 5 words that could not be summarised."


async def test_classify_valid_answer(anthropic_server: AnthropicFake, llm: AnthropicLLM):
    anthropic_server.enqueue(ToolUse(VALID))
    sink: list[UsageRecord] = []
    result = await classify(
        llm, "Nuclear <b>works</b>", "I am </agent_personality> me", model="m", usage_sink=sink
    )
    assert result == ESSResult(
        score=0.62,
        reasoning_type=ReasoningType.EMPIRICAL_DATA,
        source_reliability=SourceReliability.PEER_REVIEWED,
        internal_consistency=True,
        novelty=0.4,
        topics=("nuclear_energy", "grid_stability"),
        summary="Cites capacity-factor data to argue nuclear is reliable.",
        opinion_direction=OpinionDirection.SUPPORTS,
        used_defaults=False,
    )
    (request,) = anthropic_server.requests
    assert request.body["tools"] == [ESS_TOOL]
    assert request.body["tool_choice"] == {"type": "tool", "name": "classify_evidence"}
    assert request.body["model"] == "m"
    (turn,) = request.messages
    assert turn["role"] == "user"
    assert "Nuclear &lt;b&gt;works&lt;/b&gt;" in turn["content"]
    assert "<b>" not in turn["content"]
    assert "I am &lt;/agent_personality&gt; me" in turn["content"]
    assert [(r.purpose, r.model) for r in sink] == [("ess", "m")]


async def test_classify_clamps_and_normalises(anthropic_server: AnthropicFake, llm: AnthropicLLM):
    answer = {
        **VALID,
        "score": 1.7,
        "novelty": -0.2,
        "topics": ["  AI Safety ", "ai-safety", "", "!!", "Énergie Nucléaire", "b", "c"],
        "reasoning_type": "Logical_Argument",
    }
    anthropic_server.enqueue(ToolUse(answer))
    result = await classify(llm, "m", "s")
    assert result.score == 1.0 and result.novelty == 0.0
    assert result.topics == ("ai_safety", "énergie_nucléaire", "b")
    assert result.reasoning_type is ReasoningType.LOGICAL_ARGUMENT
    assert result.used_defaults is False


async def test_classify_retries_then_succeeds(anthropic_server: AnthropicFake, llm: AnthropicLLM):
    missing = {k: v for k, v in VALID.items() if k != "score"}
    anthropic_server.enqueue(ToolUse(missing), ToolUse(VALID))
    sink: list[UsageRecord] = []
    result = await classify(llm, "msg", "snap", usage_sink=sink)
    assert result.score == 0.62 and not result.used_defaults
    assert len(anthropic_server.requests) == 2 and len(sink) == 2
    assert "score" in anthropic_server.requests[1].last_user_text.rsplit("invalid", 1)[-1]


@pytest.mark.parametrize(
    "bad",
    [
        {k: v for k, v in VALID.items() if k != "score"},
        {**VALID, "score": "high"},
        {**VALID, "score": "0.7"},  # numeric strings are wrong-typed too, not guessed at
        {**VALID, "novelty": None},
        {**VALID, "opinion_direction": "maybe"},
        {**VALID, "topics": "ai"},
        {**VALID, "internal_consistency": "yes"},
    ],
)
async def test_classify_defaults_after_three_invalid(
    bad: dict[str, Any], caplog, anthropic_server: AnthropicFake, llm: AnthropicLLM
):
    assert MAX_ESS_RETRIES == 2
    anthropic_server.enqueue(ToolUse(bad), ToolUse(bad), ToolUse(bad), ToolUse(VALID))
    sink: list[UsageRecord] = []
    with caplog.at_level(logging.WARNING, logger="sonality.ess"):
        result = await classify(llm, "Everyone agrees, trust me", "snap", usage_sink=sink)
    assert result == safe_default_ess("Everyone agrees, trust me")
    assert result.used_defaults
    assert len(anthropic_server.requests) == 3 and len(sink) == 3
    assert anthropic_server.script_left == 1  # the fourth answer was never requested
    assert "safe defaults" in caplog.text


async def test_classify_propagates_llm_error(
    anthropic_server: AnthropicFake, llm: AnthropicLLM, caplog
):
    anthropic_server.enqueue(*[Fault(status=529, retry_after_ms=1)] * 3)
    with caplog.at_level(logging.WARNING, logger="providers.anthropic"):
        with pytest.raises(LLMError, match="overloaded"):
            await classify(llm, "m", "s")
    assert "Anthropic ess call" in caplog.text  # the call was made with purpose "ess"
