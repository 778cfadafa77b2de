"""Magnitude, snapshot validation and insight extraction."""

from __future__ import annotations

import logging
import math

import pytest

from providers.anthropic import AnthropicLLM
from sonality.config import EngineConfig
from sonality.ess import ESSResult, OpinionDirection, ReasoningType, SourceReliability
from sonality.llm import LLMError
from sonality.memory.updater import (
    SNAPSHOT_CHAR_LIMIT,
    compute_magnitude,
    extract_insight,
    validate_snapshot,
)
from sonality.reflection import fit_snapshot as _fit_snapshot
from sonality.state import SpongeState
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


@pytest.mark.parametrize(
    ("count", "score", "novelty", "expected"),
    [
        (0, 0.7, 0.4, 0.014),  # 0.1 * 0.7 * 0.4 * 0.5 (bootstrap)
        (9, 0.7, 0.4, 0.014),
        (10, 0.7, 0.4, 0.028),  # dampening ends at BOOTSTRAP_DAMPENING_UNTIL
        (50, 0.7, 0.0, 0.007),  # novelty floored at 0.1
        (50, 0.7, 0.05, 0.007),
        (50, 0.7, 0.1, 0.007),  # exactly at the floor
        (50, 0.7, 0.25, 0.0175),  # above the floor novelty counts as it is
        (50, 1.0, 1.0, 0.1),  # the largest step there is: the base rate
        (50, 0.0, 1.0, 0.0),
    ],
)
def test_compute_magnitude(count: int, score: float, novelty: float, expected: float):
    seed = EngineConfig(bootstrap_dampening_until=10)
    sponge = SpongeState(interaction_count=count)
    assert math.isclose(
        compute_magnitude(make_ess(score, novelty), sponge, config=seed), expected, rel_tol=1e-12
    )


@pytest.mark.parametrize("until", [0, 1, 10, 37])
def test_bootstrap_dampening_ends_exactly_at_the_configured_count(until: int):
    """The count is the given config's, and the step is halved up to, not including,
    that interaction."""
    given = EngineConfig(bootstrap_dampening_until=until)
    ess = make_ess(score=0.8, novelty=0.5)  # 0.1 * 0.8 * 0.5 = 0.04 undampened
    if until > 0:
        before = compute_magnitude(ess, SpongeState(interaction_count=until - 1), config=given)
        assert math.isclose(before, 0.02, rel_tol=1e-12)
    at = compute_magnitude(ess, SpongeState(interaction_count=until), config=given)
    after = compute_magnitude(ess, SpongeState(interaction_count=until + 1), config=given)
    assert math.isclose(at, 0.04, rel_tol=1e-12) and math.isclose(after, 0.04, rel_tol=1e-12)


def test_long_reflections_are_cut_to_the_snapshot_limit_at_a_sentence_end():
    """SNAPSHOT_CHAR_LIMIT bounds what a reflection may leave as the narrative."""
    sentences = [f"Sentence {i} says a little more about me." for i in range(200)]
    text = " ".join(sentences)
    assert len(text) > SNAPSHOT_CHAR_LIMIT
    cut = _fit_snapshot(text)
    assert len(cut) <= SNAPSHOT_CHAR_LIMIT
    assert text.startswith(cut) and cut.endswith("me.")
    # Only the partial sentence is dropped: adding the next whole one would overflow.
    kept = cut.count(". ") + 1
    assert len(" ".join(sentences[: kept + 1])) > SNAPSHOT_CHAR_LIMIT
    short = " ".join(sentences[:3])
    assert _fit_snapshot(short) == short


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
