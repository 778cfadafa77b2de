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
    MAX_SUMMARY_CHARS,
    MAX_TOPIC_CHARS,
    MAX_TOPICS,
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
    assert props["topics"]["type"] == "array" and props["topics"]["items"]["type"] == "string"


def _unbounded(schema: dict[str, Any], path: str = "$") -> list[str]:
    """Every place where a schema-constrained answer could run on without end."""
    found: list[str] = []
    kind = schema.get("type")
    if kind == "object":
        if schema.get("additionalProperties") is not False:
            found.append(f"{path}: object open to other keys")
        for key, prop in schema.get("properties", {}).items():
            found += _unbounded(prop, f"{path}.{key}")
    elif kind == "array":
        if "maxItems" not in schema:
            found.append(f"{path}: array without maxItems")
        found += _unbounded(schema.get("items", {}), f"{path}[]")
    elif kind == "string" and "enum" not in schema and "maxLength" not in schema:
        found.append(f"{path}: string without maxLength")
    elif kind in ("number", "integer") and not {"minimum", "maximum"} <= set(schema):
        found.append(f"{path}: number without minimum and maximum")
    return found


def test_every_field_of_the_schema_is_bounded():
    """A grammar-constrained server lets a small model fill whatever the schema allows:
    an unbounded `topics` array once ran to the token cap (issue 24, fault 1)."""
    schema = ESS_TOOL["input_schema"]
    assert _unbounded(schema) == []
    props = schema["properties"]
    assert (props["score"]["minimum"], props["score"]["maximum"]) == (0, 1)
    assert (props["novelty"]["minimum"], props["novelty"]["maximum"]) == (0, 1)
    assert props["topics"]["maxItems"] == MAX_TOPICS
    assert props["topics"]["items"]["maxLength"] == MAX_TOPIC_CHARS
    assert props["summary"]["maxLength"] == MAX_SUMMARY_CHARS


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


async def test_what_comes_back_is_held_to_the_schema_bounds(
    anthropic_server: AnthropicFake, llm: AnthropicLLM
):
    """A server that reads the schema only as a hint may still send a sentence as a
    topic, a page as the summary and a score of 10: all are cut to the bounds."""
    sentence = "The new nuclear power is cleaner for the environment than coal plants"
    answer = {**VALID, "score": 10, "topics": [sentence, "x" * 90], "summary": "word " * 200}
    anthropic_server.enqueue(ToolUse(answer))
    result = await classify(llm, "m", "s")
    assert result.score == 1.0 and not result.used_defaults
    assert result.topics == ("the_new_nuclear_power_is_cleaner_for_the", "x" * MAX_TOPIC_CHARS)
    assert all(len(t) <= MAX_TOPIC_CHARS for t in result.topics)
    assert len(result.summary) <= MAX_SUMMARY_CHARS and result.summary.endswith("word…")


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
