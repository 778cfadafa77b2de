"""Evidence Strength Score: how well argued is a user's message?

A forced tool call that sees only the user's words, in the third person, so the model
never grades its own agreement. Answers are validated, not trusted: a malformed one is
retried, then replaced by safe defaults that can never move a belief.

Why every field of the schema is bounded: a server that constrains its output to the
schema (llama.cpp's grammar, Structured Outputs) lets a small model write exactly what
the schema allows, so an unbounded `topics` array was once filled until the token cap,
cut off and unusable. Bounded, every answer the grammar admits fits in a few hundred
tokens. What comes back is clamped to the same bounds anyway, for servers that only
read the schema as a hint.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import re
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, Field, ValidationError, field_validator
from pydantic.dataclasses import dataclass

from sonality.config import MAX_ESS_RETRIES
from sonality.llm import ChatTurn, LLMClient, LLMError, SystemBlock
from sonality.prompts import ESS_GUIDE, ESS_MESSAGE_PROMPT, ESS_SYSTEM_PROMPT, escape_prompt_text
from sonality.store import UsageRecord

log = logging.getLogger(__name__)

ESS_MAX_TOKENS = 1024
MAX_TOPICS = 3
#: A topic label is a key ("nuclear_energy"), not a sentence.
MAX_TOPIC_CHARS = 40
#: One sentence; the schema's bound, and what a longer summary is cut to.
MAX_SUMMARY_CHARS = 300


def fallback_summary(user_message: str) -> str:
    """A summary that never quotes the message: summaries outlive its text (memories,
    audit, evidence log), so a quote would escape retention and forget-me."""
    words = len(user_message.split())
    return f"A message of {words} word{'' if words == 1 else 's'} that could not be summarised."


#: The summary of a message without words (`wordless_ess`).
WORDLESS_SUMMARY = "The sender wrote no words."
_FALLBACK = re.compile(r"A message of \d+ words? that could not be summarised\.")


def made_summary(summary: str) -> bool:
    """Whether `summary` is one the bot writes itself (`fallback_summary`,
    `WORDLESS_SUMMARY`), the same for every member's message and quoting none: a
    forget-me or deletion has nothing of the member's to take out of it, and must not
    take it from another member's rows."""
    return summary == WORDLESS_SUMMARY or _FALLBACK.fullmatch(summary) is not None


class ReasoningType(StrEnum):
    LOGICAL_ARGUMENT = "logical_argument"
    EMPIRICAL_DATA = "empirical_data"
    EXPERT_OPINION = "expert_opinion"
    ANECDOTAL = "anecdotal"
    SOCIAL_PRESSURE = "social_pressure"
    EMOTIONAL_APPEAL = "emotional_appeal"
    NO_ARGUMENT = "no_argument"


class OpinionDirection(StrEnum):
    SUPPORTS = "supports"
    OPPOSES = "opposes"
    NEUTRAL = "neutral"

    @property
    def sign(self) -> float:
        """+1.0 / -1.0 / 0.0, the factor an opinion update multiplies its magnitude by."""
        return {OpinionDirection.SUPPORTS: 1.0, OpinionDirection.OPPOSES: -1.0}.get(self, 0.0)


class SourceReliability(StrEnum):
    PEER_REVIEWED = "peer_reviewed"
    ESTABLISHED_EXPERT = "established_expert"
    INFORMED_OPINION = "informed_opinion"
    CASUAL_OBSERVATION = "casual_observation"
    UNVERIFIED_CLAIM = "unverified_claim"
    NOT_APPLICABLE = "not_applicable"


@dataclass(frozen=True)
class ESSResult:
    """One classification, frozen as it was audited."""

    score: float
    reasoning_type: ReasoningType
    source_reliability: SourceReliability
    internal_consistency: bool
    novelty: float
    topics: tuple[str, ...]
    summary: str
    # The seed's public defaults: code that names no direction gets a neutral one,
    # which never moves an opinion.
    opinion_direction: OpinionDirection = OpinionDirection.NEUTRAL
    used_defaults: bool = False


# Field meanings are in the prompt's guide; every field is bounded (see the docstring).
_UNIT = {"type": "number", "minimum": 0, "maximum": 1}
_ESS_PROPERTIES: dict[str, Any] = {
    "score": _UNIT,
    "reasoning_type": {"type": "string", "enum": [m.value for m in ReasoningType]},
    "source_reliability": {"type": "string", "enum": [m.value for m in SourceReliability]},
    "internal_consistency": {"type": "boolean"},
    "novelty": _UNIT,
    "topics": {
        "type": "array",
        "items": {"type": "string", "minLength": 1, "maxLength": MAX_TOPIC_CHARS},
        "maxItems": MAX_TOPICS,
    },
    "summary": {"type": "string", "maxLength": MAX_SUMMARY_CHARS},
    "opinion_direction": {"type": "string", "enum": [m.value for m in OpinionDirection]},
}

ESS_TOOL: dict[str, Any] = {
    "name": "classify_evidence",
    "description": "Rate the strength of the evidence in the message and extract its metadata.",
    "input_schema": {
        "type": "object",
        "properties": _ESS_PROPERTIES,
        "required": list(_ESS_PROPERTIES),
        "additionalProperties": False,
    },
}


def normalize_topic(label: str) -> str:
    """Lowercase snake_case, so spellings of one topic key one belief; non-ASCII
    letters are kept ("Nuclear Energy" -> "nuclear_energy"); at most MAX_TOPIC_CHARS,
    cut at a word where one is near, so a sentence passed off as a label stays a key."""
    label = re.sub(r"[\W_]+", "_", label.casefold()).strip("_")
    if len(label) <= MAX_TOPIC_CHARS:
        return label
    cut = label[: MAX_TOPIC_CHARS + 1]
    end = cut.rfind("_")
    return (cut[:end] if end >= MAX_TOPIC_CHARS // 2 else cut[:MAX_TOPIC_CHARS]).strip("_")


def clip_summary(text: str) -> str:
    """One line of at most MAX_SUMMARY_CHARS, cut at a word (with an ellipsis) if longer."""
    text = " ".join(text.split())
    if len(text) <= MAX_SUMMARY_CHARS:
        return text
    cut = text[: MAX_SUMMARY_CHARS - 1]
    space = cut.rfind(" ")
    return (cut[:space] if space >= MAX_SUMMARY_CHARS // 2 else cut).rstrip(" ,;:") + "…"


class _ToolInput(BaseModel):
    """A valid answer: strict types (a score of "0.7" is malformed), enums in any case."""

    score: float = Field(strict=True)
    reasoning_type: ReasoningType
    source_reliability: SourceReliability
    internal_consistency: bool = Field(strict=True)
    novelty: float = Field(strict=True)
    topics: list[str] = Field(strict=True)
    summary: str = Field(strict=True)
    opinion_direction: OpinionDirection

    @field_validator("reasoning_type", "source_reliability", "opinion_direction", mode="before")
    @classmethod
    def _fold_enum_case(cls, value: object) -> object:
        return value.strip().lower() if isinstance(value, str) else value

    @field_validator("score", "novelty")
    @classmethod
    def _clamp_unit(cls, value: float) -> float:
        if not math.isfinite(value):
            raise ValueError("must be a finite number")
        return min(1.0, max(0.0, value))

    @field_validator("topics")
    @classmethod
    def _clean_topics(cls, value: list[str]) -> list[str]:
        return [t for t in dict.fromkeys(map(normalize_topic, value)) if t][:MAX_TOPICS]


def safe_default_ess(user_message: str) -> ESSResult:
    """Score 0 and neutral: never passes the threshold, yet the episode is stored."""
    return ESSResult(
        score=0.0,
        reasoning_type=ReasoningType.NO_ARGUMENT,
        source_reliability=SourceReliability.NOT_APPLICABLE,
        internal_consistency=False,
        novelty=0.0,
        topics=(),
        summary=fallback_summary(user_message),
        opinion_direction=OpinionDirection.NEUTRAL,
        used_defaults=True,
    )


def wordless_ess() -> ESSResult:
    """The rating of a message without words (pictures only): no model is asked, since
    the rating judges words and there are none, and nothing in it can move a belief."""
    return dataclasses.replace(
        safe_default_ess(""),
        internal_consistency=True,
        summary=WORDLESS_SUMMARY,
        used_defaults=False,
    )


def _describe_errors(error: ValidationError) -> str:
    """Field names and error kinds only: the offending values may echo user text."""
    return "; ".join(
        f"{'.'.join(str(p) for p in item['loc']) or 'input'}: {item['type']}"
        for item in error.errors()
    )


def _to_result(data: _ToolInput, user_message: str) -> ESSResult:
    return ESSResult(
        **data.model_dump(exclude={"topics", "summary"}),
        topics=tuple(data.topics),
        summary=clip_summary(data.summary) or fallback_summary(user_message),
    )


async def classify(
    client: LLMClient,
    user_message: str,
    sponge_snapshot: str,
    *,
    model: str | None = None,
    usage_sink: list[UsageRecord] | None = None,
) -> ESSResult:
    """Score the evidence in `user_message` alone.

    `sponge_snapshot` is the agent's views, for novelty only. An invalid answer is
    retried MAX_ESS_RETRIES times, then `safe_default_ess`; `LLMError` propagates.
    """
    prompt = ESS_MESSAGE_PROMPT.format(
        user_message=escape_prompt_text(user_message),
        sponge_snapshot=escape_prompt_text(sponge_snapshot),
    )
    # The schema and the guide never change: a cacheable prefix.
    system = [SystemBlock(text=ESS_SYSTEM_PROMPT + "\n\n" + ESS_GUIDE, cache=True)]
    problems: list[str] = []

    for attempt in range(1 + MAX_ESS_RETRIES):
        content = prompt
        if problems:
            content += (
                "\n\nYour previous call to classify_evidence was invalid "
                f"({problems[-1]}). Call it again with every field filled in correctly."
            )
        try:
            result = await client.call_tool(
                system=system,
                messages=[ChatTurn(role="user", content=content)],
                tool=ESS_TOOL,
                max_tokens=ESS_MAX_TOKENS,
                model=model,
                purpose="ess",
            )
        except LLMError as err:  # what answered before the failure was paid for
            if usage_sink is not None and err.spent is not None:
                usage_sink.append(
                    UsageRecord(purpose="ess", model=err.spent.model, usage=err.spent.usage)
                )
            raise
        if usage_sink is not None:
            usage_sink.append(UsageRecord(purpose="ess", model=result.model, usage=result.usage))
        try:
            parsed = _ToolInput.model_validate(result.tool_input)
        except ValidationError as error:
            problems.append(_describe_errors(error))
            log.warning("ESS attempt %d returned invalid tool input: %s", attempt + 1, problems[-1])
            continue
        return _to_result(parsed, user_message)

    log.warning(
        "ESS gave no valid answer after %d attempts; using safe defaults (%s)",
        1 + MAX_ESS_RETRIES,
        " | ".join(problems),
    )
    return safe_default_ess(user_message)
