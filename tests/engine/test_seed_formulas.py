"""The seed's belief arithmetic at points where a wrong formula would still look plausible.

Every expected value is computed by hand from the seed formulas (written out in the
comments), not by calling the code under test, so a changed coefficient, a dropped
term or a swapped sign fails here.

* Bayesian resistance, on the agent's staging step `SonalityAgent._update_opinions`:
  effective = magnitude / (confidence + 1), where confidence gains |position| when the
  evidence argues against the current stance.
* Structural disagreement, `_disagrees`.
* Power-law decay: confidence = base(evidence) * max((1 + gap) ** -beta,
  min(0.6, 0.06 * evidence)), untouched while gap < 5.
"""

from __future__ import annotations

import math

import pytest

from sonality.agent import SonalityAgent
from sonality.config import EngineConfig
from sonality.ess import ESSResult, OpinionDirection, ReasoningType, SourceReliability
from sonality.opinions import disagrees as _disagrees
from sonality.state import BeliefMeta, SpongeState

SUPPORTS = OpinionDirection.SUPPORTS
OPPOSES = OpinionDirection.OPPOSES
NEUTRAL = OpinionDirection.NEUTRAL
LOG2_20 = math.log2(20)


def close(actual: float, expected: float) -> bool:
    return math.isclose(actual, expected, rel_tol=1e-12, abs_tol=1e-15)


def ess(
    direction: OpinionDirection,
    *topics: str,
    score: float = 0.8,
    novelty: float = 0.5,
) -> ESSResult:
    return ESSResult(
        score=score,
        reasoning_type=ReasoningType.EMPIRICAL_DATA,
        source_reliability=SourceReliability.PEER_REVIEWED,
        internal_consistency=True,
        novelty=novelty,
        topics=topics,
        summary="A trial with a control group.",
        opinion_direction=direction,
    )


#: The seed's values (threshold 0.3, dampening until 10, cooling 3), whatever the
#: environment running the tests configured.
SEED = EngineConfig()


# --- Bayesian resistance ------------------------------------------------------------------

# Past the bootstrap, score 0.8 and novelty 0.5 earn 0.1 * 0.8 * 0.5 = 0.04 before
# resistance.
MATURE = 50


@pytest.mark.parametrize(
    ("position", "confidence", "direction", "expected"),
    [
        # Same direction as the stance: only the confidence resists.
        pytest.param(0.4, 0.5, SUPPORTS, +0.04 / 1.5, id="with-positive-stance"),
        pytest.param(-0.3, 0.25, OPPOSES, -0.04 / 1.25, id="with-negative-stance"),
        # Against the stance: |position| joins the confidence.
        pytest.param(0.4, 0.5, OPPOSES, -0.04 / (0.5 + 0.4 + 1), id="against-positive-stance"),
        pytest.param(-0.3, 0.25, SUPPORTS, +0.04 / (0.25 + 0.3 + 1), id="against-negative"),
        # A belief sitting at exactly 0 has no side to argue against.
        pytest.param(0.0, 0.4, OPPOSES, -0.04 / 1.4, id="neutral-stance"),
        # A saturated, extreme belief: the step is a fifth of the unresisted one.
        pytest.param(-1.0, 1.0, SUPPORTS, +0.04 / 3.0, id="saturated-against"),
    ],
)
def test_staged_move_is_resisted_by_confidence_and_opposed_position(
    position: float, confidence: float, direction: OpinionDirection, expected: float
) -> None:
    state = SpongeState(
        interaction_count=MATURE,
        opinion_vectors={"tutoring": position},
        belief_meta={"tutoring": BeliefMeta(confidence=confidence, evidence_count=4)},
    )
    staged = SonalityAgent._update_opinions(state, ess(direction, "tutoring"), config=SEED)

    (update,) = state.staged_opinion_updates
    assert update.topic == "tutoring"
    assert close(update.signed_magnitude, expected)
    assert update.due_interaction == MATURE + 3
    assert staged == [{"topic": "tutoring", "delta": round(expected, 6), "due": MATURE + 3}]
    # Staging moves nothing yet.
    assert state.opinion_vectors == {"tutoring": position}


def test_resistance_is_per_topic_and_uses_the_stored_confidence() -> None:
    """One message on three topics: each is resisted by its own belief. The confidence
    used is the stored (possibly decayed) value, not one recomputed from the evidence."""
    state = SpongeState(
        interaction_count=MATURE,
        opinion_vectors={"held": 0.6, "decayed": -0.2},
        belief_meta={
            "held": BeliefMeta(confidence=0.8, evidence_count=9),
            # evidence 9 would mean confidence 0.77; decay left 0.1
            "decayed": BeliefMeta(confidence=0.1, evidence_count=9),
        },
    )
    SonalityAgent._update_opinions(state, ess(OPPOSES, "held", "decayed", "new"), config=SEED)
    moves = {u.topic: u.signed_magnitude for u in state.staged_opinion_updates}
    assert moves.keys() == {"held", "decayed", "new"}
    assert close(moves["held"], -0.04 / (0.8 + 0.6 + 1))  # against +0.6
    assert close(moves["decayed"], -0.04 / (0.1 + 1))  # same side as -0.2
    assert close(moves["new"], -0.04)  # no belief, no resistance


def test_resistance_applies_on_top_of_bootstrap_dampening() -> None:
    # Young: 0.1 * 0.8 * 0.5 * 0.5 = 0.02, then resisted by 0.5 + |0.4| + 1.
    state = SpongeState(
        interaction_count=9,
        opinion_vectors={"tutoring": 0.4},
        belief_meta={"tutoring": BeliefMeta(confidence=0.5)},
    )
    SonalityAgent._update_opinions(state, ess(OPPOSES, "tutoring"), config=SEED)
    (update,) = state.staged_opinion_updates
    assert close(update.signed_magnitude, -0.02 / 1.9)


@pytest.mark.parametrize(
    ("score", "direction", "topics"),
    [
        pytest.param(0.3, SUPPORTS, ("tutoring",), id="score-at-threshold"),
        pytest.param(0.9, NEUTRAL, ("tutoring",), id="no-direction"),
        pytest.param(0.9, SUPPORTS, (), id="no-topic"),
    ],
)
def test_nothing_is_staged_without_strong_directional_evidence(
    score: float, direction: OpinionDirection, topics: tuple[str, ...]
) -> None:
    state = SpongeState(interaction_count=MATURE)
    strong = ess(direction, *topics, score=score)
    staged = SonalityAgent._update_opinions(state, strong, config=SEED)
    assert staged == []
    assert state.staged_opinion_updates == []


# --- structural disagreement ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("stances", "direction", "topics", "disagrees"),
    [
        pytest.param({"ai": -0.3}, SUPPORTS, ("ai",), True, id="supports-vs-negative"),
        pytest.param({"ai": 0.3}, OPPOSES, ("ai",), True, id="opposes-vs-positive"),
        pytest.param({"ai": 0.3}, SUPPORTS, ("ai",), False, id="supports-vs-positive"),
        pytest.param({"ai": -0.3}, OPPOSES, ("ai",), False, id="opposes-vs-negative"),
        pytest.param({"ai": -0.3}, NEUTRAL, ("ai",), False, id="neutral"),
        pytest.param({"ai": 0.0}, OPPOSES, ("ai",), False, id="stance-exactly-zero"),
        pytest.param({"art": 0.5}, OPPOSES, ("ai",), False, id="topic-without-stance"),
        pytest.param(
            {"ai": 0.2, "art": -0.4, "law": 0.7},
            SUPPORTS,
            ("ai", "art", "law"),
            True,
            id="one-of-several-disagrees",
        ),
        pytest.param(
            {"ai": 0.2, "law": 0.7}, SUPPORTS, ("ai", "art", "law"), False, id="none-of-several"
        ),
    ],
)
def test_disagrees(
    stances: dict[str, float],
    direction: OpinionDirection,
    topics: tuple[str, ...],
    disagrees: bool,
) -> None:
    state = SpongeState(opinion_vectors=stances)
    assert _disagrees(state, ess(direction, *topics)) is disagrees


# --- power-law decay ------------------------------------------------------------------------


def decayed(evidence: int, gap: int, stored: float = 0.5) -> float:
    state = SpongeState(
        interaction_count=1000 + gap,
        opinion_vectors={"t": 0.3},
        belief_meta={
            "t": BeliefMeta(confidence=stored, evidence_count=evidence, last_reinforced=1000)
        },
    )
    assert state.decay_beliefs(decay_rate=0.15, min_confidence=0.0) == []
    return state.belief_meta["t"].confidence


def test_decay_leaves_a_belief_alone_until_five_interactions_pass() -> None:
    assert decayed(evidence=1, gap=4, stored=0.5) == 0.5
    # gap 5: log2(2)/log2(20) * 6 ** -0.15 (floor 0.06 is lower)
    assert close(decayed(evidence=1, gap=5), 1 / LOG2_20 * 6**-0.15)


@pytest.mark.parametrize(
    ("evidence", "gap", "expected"),
    [
        # retention 11 ** -0.15 = 0.698 beats the floor 0.06 * 3 = 0.18
        pytest.param(3, 10, 2 / LOG2_20 * 11**-0.15, id="retention-wins"),
        # retention 1001 ** -0.15 = 0.355 beats the floor 0.06 * 5 = 0.3
        pytest.param(5, 1000, math.log2(6) / LOG2_20 * 1001**-0.15, id="retention-over-floor"),
        # retention 10001 ** -0.15 = 0.251 loses to the floor 0.3
        pytest.param(5, 10_000, math.log2(6) / LOG2_20 * 0.3, id="floor-wins"),
        # the floor 0.06 * 15 = 0.9 is capped at 0.6
        pytest.param(15, 10_000, 4 / LOG2_20 * 0.6, id="floor-capped"),
        # confidence saturates at evidence 19; the capped floor still applies
        pytest.param(40, 10_000, 1.0 * 0.6, id="saturated"),
    ],
)
def test_decay_power_law_with_reinforcement_floor(evidence: int, gap: int, expected: float) -> None:
    assert close(decayed(evidence, gap), expected)


def test_decay_starts_from_the_evidence_not_the_stored_confidence() -> None:
    """Two beliefs with the same evidence and gap decay to the same value whatever
    confidence they held before, so decay never compounds."""
    assert decayed(3, 10, stored=0.9) == decayed(3, 10, stored=0.01)
