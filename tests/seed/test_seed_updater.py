"""`sonality.memory.updater` as 002 and 004 describe it: the step an argument earns,
the guard on a rewritten snapshot, and one-sentence insights."""

from __future__ import annotations

import pytest

from providers.anthropic import AnthropicLLM
from sonality import config
from sonality.ess import ESSResult
from sonality.memory.sponge import SpongeState
from sonality.memory.updater import (
    MIN_SNAPSHOT_RETENTION,
    SNAPSHOT_CHAR_LIMIT,
    compute_magnitude,
    extract_insight,
    validate_snapshot,
)
from tests.fakes.anthropic_server import AnthropicFake, Text
from tests.seed.test_seed_ess import RATED


def rated(score: float, novelty: float) -> ESSResult:
    """A rating as seed-shaped code builds it: no direction, no defaults flag."""
    return ESSResult(**{**RATED, "score": score, "novelty": novelty})


def test_the_constants() -> None:
    assert SNAPSHOT_CHAR_LIMIT == config.SPONGE_MAX_TOKENS * 5 == 2500
    assert MIN_SNAPSHOT_RETENTION == 0.6


@pytest.mark.parametrize(
    ("score", "novelty", "interactions", "expected"),
    [
        # base rate 0.1 x score x max(novelty, 0.1) x dampening
        (0.8, 0.5, 10, 0.1 * 0.8 * 0.5 * 1.0),  # grown up: no dampening
        (0.8, 0.5, 9, 0.1 * 0.8 * 0.5 * 0.5),  # the first 10 interactions: halved
        (0.6, 0.0, 50, 0.1 * 0.6 * 0.1 * 1.0),  # nothing new still earns the 0.1 floor
        (0.6, 0.05, 0, 0.1 * 0.6 * 0.1 * 0.5),
        (1.0, 1.0, 11, 0.1),
    ],
)
def test_compute_magnitude(
    score: float, novelty: float, interactions: int, expected: float
) -> None:
    sponge = SpongeState(interaction_count=interactions)
    assert compute_magnitude(rated(score, novelty), sponge) == pytest.approx(expected)


def test_validate_snapshot() -> None:
    old = "x" * 1000
    assert validate_snapshot(old, "y" * 600)  # exactly 60% kept
    assert not validate_snapshot(old, "y" * 599)
    assert validate_snapshot(old, "y" * 2000)  # growing is fine
    assert not validate_snapshot("short", "y" * 29)  # under 30 characters, always refused
    assert validate_snapshot("short", "y" * 30)


async def test_an_insight_is_one_sentence_from_short_excerpts(
    anthropic_server: AnthropicFake, llm: AnthropicLLM
) -> None:
    anthropic_server.enqueue(Text("Weighs mechanisms above slogans."))
    user = "m" * 300 + "n" * 50
    reply = "r" * 300 + "s" * 50
    insight = await extract_insight(llm, rated(0.7, 0.4), user, reply)
    assert insight == "Weighs mechanisms above slogans."
    [request] = anthropic_server.requests
    prompt = request.last_user_text
    assert "m" * 300 in prompt and "m" * 300 + "n" not in prompt  # cut to 300 characters
    assert "r" * 300 in prompt and "r" * 300 + "s" not in prompt
    assert "0.7" in prompt  # the score is part of the question


@pytest.mark.parametrize("answer", ["NONE", "", "   "])
async def test_no_insight_is_none(
    anthropic_server: AnthropicFake, llm: AnthropicLLM, answer: str
) -> None:
    anthropic_server.enqueue(Text(answer))
    assert await extract_insight(llm, rated(0.7, 0.4), "a message", "a reply") is None
