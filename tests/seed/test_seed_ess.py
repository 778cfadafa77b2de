"""`sonality.ess` as 002 and 004 describe it: the enums, the frozen result and its
defaults, the tool schema, and `classify`'s retries and safe defaults."""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any

import pytest

from providers.anthropic import AnthropicLLM
from sonality import config
from sonality.ess import (
    ESS_TOOL,
    ESSResult,
    OpinionDirection,
    ReasoningType,
    SourceReliability,
    classify,
)
from tests.fakes.anthropic_server import AnthropicFake, ToolUse

#: 004's schema table, in its order, and the enum members it lists.
FIELDS = (
    "score reasoning_type source_reliability internal_consistency novelty topics summary "
    "opinion_direction"
).split()
REASONING = (
    "logical_argument empirical_data expert_opinion anecdotal social_pressure "
    "emotional_appeal no_argument"
).split()
RELIABILITY = (
    "peer_reviewed established_expert informed_opinion casual_observation unverified_claim "
    "not_applicable"
).split()
#: The eight rated fields but the direction, as seed-shaped code may write them.
RATED: dict[str, Any] = {
    "score": 0.7,
    "reasoning_type": ReasoningType.EMPIRICAL_DATA,
    "source_reliability": SourceReliability.PEER_REVIEWED,
    "internal_consistency": True,
    "novelty": 0.5,
    "topics": ("sleep",),
    "summary": "The sender cites a sleep study.",
}
ANSWER: dict[str, Any] = {
    "score": 0.55,
    "reasoning_type": "logical_argument",
    "source_reliability": "informed_opinion",
    "internal_consistency": True,
    "novelty": 0.6,
    "topics": ["urban_cycling"],
    "summary": "The sender argues that protected bike lanes cut injuries.",
    "opinion_direction": "supports",
}


def test_the_enums_have_the_documented_members_and_values() -> None:
    assert [m.value for m in ReasoningType] == REASONING
    assert [m.value for m in SourceReliability] == RELIABILITY
    assert [m.value for m in OpinionDirection] == ["supports", "opposes", "neutral"]
    # Each is a string enum: a member equals its value.
    assert ReasoningType.ANECDOTAL == "anecdotal"
    assert SourceReliability.PEER_REVIEWED == "peer_reviewed"
    assert OpinionDirection("opposes") is OpinionDirection.OPPOSES


def test_a_direction_signs_a_move() -> None:
    signs = {d: d.sign for d in OpinionDirection}
    assert signs == {
        OpinionDirection.SUPPORTS: 1.0,
        OpinionDirection.OPPOSES: -1.0,
        OpinionDirection.NEUTRAL: 0.0,
    }
    assert all(isinstance(sign, float) for sign in signs.values())


def test_the_result_is_a_frozen_dataclass_of_nine_fields() -> None:
    assert [f.name for f in dataclasses.fields(ESSResult)] == [*FIELDS, "used_defaults"]
    result = ESSResult(**RATED, opinion_direction=OpinionDirection.SUPPORTS)
    with pytest.raises(dataclasses.FrozenInstanceError):
        result.score = 0.9  # type: ignore[misc]


def test_a_result_built_without_direction_or_flag_is_neutral_and_not_defaulted() -> None:
    """Code written against the seed names the eight rated fields and stops there."""
    result = ESSResult(**RATED)
    assert result.opinion_direction is OpinionDirection.NEUTRAL
    assert result.opinion_direction.sign == 0.0  # a neutral result moves nothing
    assert result.used_defaults is False


def test_the_tool_schema_forces_every_field() -> None:
    assert ESS_TOOL["name"] == "classify_evidence"
    assert ESS_TOOL["description"]
    schema = ESS_TOOL["input_schema"]
    assert schema["type"] == "object"
    assert schema["required"] == FIELDS
    props = schema["properties"]
    assert list(props) == FIELDS
    assert props["reasoning_type"]["enum"] == REASONING
    assert props["source_reliability"]["enum"] == RELIABILITY
    assert props["opinion_direction"]["enum"] == ["supports", "opposes", "neutral"]
    kinds = {name: spec["type"] for name, spec in props.items()}
    assert kinds == {
        "score": "number",
        "reasoning_type": "string",
        "source_reliability": "string",
        "internal_consistency": "boolean",
        "novelty": "number",
        "topics": "array",
        "summary": "string",
        "opinion_direction": "string",
    }
    assert props["topics"]["items"]["type"] == "string"


def test_classify_takes_the_message_and_the_snapshot_but_never_the_reply() -> None:
    """004: the agent's own response is never shown to the rater."""
    params = list(inspect.signature(classify).parameters.values())
    assert [p.name for p in params[:3]] == ["client", "user_message", "sponge_snapshot"]
    assert not [p for p in params if "response" in p.name or "reply" in p.name]


async def test_classify_returns_the_rating_and_sends_only_the_users_words(
    anthropic_server: AnthropicFake, llm: AnthropicLLM
) -> None:
    anthropic_server.enqueue(ToolUse(ANSWER))
    message = "Protected bike lanes cut cyclist injuries by half in Copenhagen."
    result = await classify(llm, message, "I have no view on cycling yet.")
    assert result == ESSResult(
        score=0.55,
        reasoning_type=ReasoningType.LOGICAL_ARGUMENT,
        source_reliability=SourceReliability.INFORMED_OPINION,
        internal_consistency=True,
        novelty=0.6,
        topics=("urban_cycling",),
        summary="The sender argues that protected bike lanes cut injuries.",
        opinion_direction=OpinionDirection.SUPPORTS,
        used_defaults=False,
    )
    [request] = anthropic_server.requests
    assert request.body["tool_choice"] == {"type": "tool", "name": "classify_evidence"}
    assert message in request.user_text
    assert "I have no view on cycling yet." in request.user_text  # for novelty


@pytest.mark.parametrize("missing", ["score", "opinion_direction", "topics"])
async def test_an_incomplete_answer_is_retried_twice_then_safe_defaults(
    anthropic_server: AnthropicFake, llm: AnthropicLLM, missing: str
) -> None:
    incomplete = {k: v for k, v in ANSWER.items() if k != missing}
    anthropic_server.enqueue(*[ToolUse(incomplete)] * (1 + config.MAX_ESS_RETRIES))
    result = await classify(llm, "Trust me, everybody knows it.", "snapshot")
    assert len(anthropic_server.requests) == 1 + 2  # the first try and MAX_ESS_RETRIES
    assert result.used_defaults is True
    assert result.score == 0.0
    assert result.reasoning_type is ReasoningType.NO_ARGUMENT
    assert result.opinion_direction is OpinionDirection.NEUTRAL
    assert result.topics == ()


async def test_a_retry_that_completes_the_answer_is_used(
    anthropic_server: AnthropicFake, llm: AnthropicLLM
) -> None:
    incomplete = {k: v for k, v in ANSWER.items() if k != "novelty"}
    anthropic_server.enqueue(ToolUse(incomplete), ToolUse(ANSWER))
    result = await classify(llm, "Bike lanes: the Copenhagen data.", "snapshot")
    assert len(anthropic_server.requests) == 2
    assert result.used_defaults is False and result.novelty == 0.6
