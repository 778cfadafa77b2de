"""Magnitude, snapshot validation and insight extraction."""

from __future__ import annotations

import logging

import pytest

from providers.anthropic import AnthropicLLM
from sonality.config import BOOTSTRAP_DAMPENING_UNTIL
from sonality.ess import ESSResult, OpinionDirection, ReasoningType, SourceReliability
from sonality.llm import LLMError
from sonality.memory.sponge import SpongeState
from sonality.memory.updater import (
    MIN_SNAPSHOT_RETENTION,
    SNAPSHOT_CHAR_LIMIT,
    compute_magnitude,
    extract_insight,
    validate_snapshot,
)
from sonality.store import UsageRecord
from tests.fakes.anthropic_server import AnthropicFake, Fault, Text


def make_ess(score: float = 0.7, novelty: float = 0.4) -> ESSResult:
    return ESSResult(
        score=score,
        reasoning_type=ReasoningType.EMPIRICAL_DATA,
        source_reliability=SourceReliability.PEER_REVIEWED,
        internal_consistency=True,
        novelty=novelty,
        topics=("nuclear_energy",),
        summary="Argues for nuclear power with grid data.",
        opinion_direction=OpinionDirection.SUPPORTS,
    )


def test_constants():
    assert SNAPSHOT_CHAR_LIMIT == 2500
    assert MIN_SNAPSHOT_RETENTION == 0.6
    assert BOOTSTRAP_DAMPENING_UNTIL == 10


@pytest.mark.parametrize(
    ("count", "score", "novelty", "expected"),
    [
        (0, 0.7, 0.4, 0.014),  # 0.1 * 0.7 * 0.4 * 0.5 (bootstrap)
        (9, 0.7, 0.4, 0.014),
        (10, 0.7, 0.4, 0.028),  # dampening ends at BOOTSTRAP_DAMPENING_UNTIL
        (50, 0.7, 0.0, 0.007),  # novelty floored at 0.1
        (50, 0.7, 0.05, 0.007),
        (50, 0.0, 1.0, 0.0),
    ],
)
def test_compute_magnitude(count: int, score: float, novelty: float, expected: float):
    sponge = SpongeState(interaction_count=count)
    assert compute_magnitude(make_ess(score, novelty), sponge) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("old", "new", "ok"),
    [
        ("x" * 100, "y" * 60, True),
        ("x" * 100, "y" * 59, False),
        ("x" * 100, "y" * 300, True),
        ("x" * 20, "y" * 29, False),  # under 30 chars even though ratio is fine
        ("x" * 20, "y" * 30, True),
        ("", "y" * 30, True),  # no old snapshot: only the minimum length applies
        ("", "", False),
        ("x" * 100, "   " + "y" * 20 + " " * 60, False),  # padding does not count
    ],
)
def test_validate_snapshot(old: str, new: str, ok: bool):
    assert validate_snapshot(old, new) is ok


async def test_extract_insight_prompt_and_usage(anthropic_server: AnthropicFake, llm: AnthropicLLM):
    anthropic_server.enqueue(
        Text("  Holds its ground when pressed for agreement.\n", usage={"input_tokens": 100})
    )
    sink: list[UsageRecord] = []
    long_user = "U" * 290 + "<tag>" + "Z" * 400
    result = await extract_insight(
        llm, make_ess(score=0.73), long_user, "A" * 1000, model="m1", usage_sink=sink
    )
    assert result == "Holds its ground when pressed for agreement."
    (request,) = anthropic_server.requests
    assert "tools" not in request.body and request.body["model"] == "m1"
    prompt = request.last_user_text
    assert "0.73" in prompt
    assert "U" * 290 + "&lt;tag&gt;" + "Z" * 5 in prompt and "Z" * 6 not in prompt
    assert "A" * 300 in prompt and "A" * 301 not in prompt
    assert [r.purpose for r in sink] == ["insight"]
    assert sink[0].model == "m1" and sink[0].usage.input_tokens == 100


@pytest.mark.parametrize("answer", ["NONE", "none.", "  \n", "", '"NONE"'])
async def test_extract_insight_none(
    answer: str, anthropic_server: AnthropicFake, llm: AnthropicLLM
):
    anthropic_server.enqueue(Text(answer))
    assert await extract_insight(llm, make_ess(), "u", "a") is None


async def test_extract_insight_keeps_first_line_only(
    anthropic_server: AnthropicFake, llm: AnthropicLLM
):
    anthropic_server.enqueue(Text('\n"Prefers mechanisms to slogans."\nSecond line.'))
    assert await extract_insight(llm, make_ess(), "u", "a") == "Prefers mechanisms to slogans."


async def test_extract_insight_propagates_llm_error(
    anthropic_server: AnthropicFake, llm: AnthropicLLM, caplog
):
    anthropic_server.enqueue(*[Fault(status=500, retry_after_ms=1)] * 3)
    with caplog.at_level(logging.WARNING, logger="providers.anthropic"):
        with pytest.raises(LLMError):
            await extract_insight(llm, make_ess(), "u", "a")
    assert "Anthropic insight call" in caplog.text  # the call was made with purpose "insight"
