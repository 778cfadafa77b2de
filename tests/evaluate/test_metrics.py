"""The evaluation's arithmetic against values worked out by hand."""

from __future__ import annotations

import math

import pytest

from bot.evaluate.metrics import (
    average_ranks,
    number_of_flips,
    rate,
    spearman,
    stance_flipped,
    turn_of_flip,
)
from bot.evaluate.report import (
    EvidenceArm,
    EvidenceRun,
    MemoryResult,
    MemoryRun,
    check_gates,
    parse_bounds,
    summarize_memory,
)
from bot.evaluate.runner import judge_evidence_run


def test_average_ranks_share_the_mean_of_tied_positions() -> None:
    assert average_ranks([30.0, 10.0, 20.0, 20.0]) == [4.0, 1.0, 2.5, 2.5]
    assert average_ranks([5.0, 5.0, 5.0]) == [2.0, 2.0, 2.0]


def test_spearman_with_ties_matches_the_hand_computation() -> None:
    # Tier ranks 1.5 1.5 3.5 3.5 5.5 5.5, score ranks 1 2.5 2.5 5 4 6 (both mean 3.5):
    # sum dx*dy = 5 + 2 + 0 + 0 + 1 + 5 = 13, sum dx^2 = 16, sum dy^2 = 17.
    tiers = [1.0, 1.0, 2.0, 2.0, 3.0, 3.0]
    scores = [0.1, 0.2, 0.2, 0.5, 0.4, 0.9]
    assert spearman(tiers, scores) == pytest.approx(13 / math.sqrt(16 * 17))


def test_spearman_without_ties_is_the_rank_difference_formula() -> None:
    # The principled stand-in's first message per tier: ranks by score 1 3 4 2 5 6 7 8,
    # sum d^2 = 0 + 1 + 1 + 4 = 6, rho = 1 - 6 * 6 / (8 * 63) = 13/14.
    scores = [0.02, 0.08, 0.10, 0.05, 0.18, 0.50, 0.72, 0.85]
    assert spearman([float(t) for t in range(1, 9)], scores) == pytest.approx(13 / 14)
    assert spearman([1.0, 2.0, 3.0], [3.0, 2.0, 1.0]) == pytest.approx(-1.0)


def test_spearman_is_undefined_without_spread() -> None:
    assert spearman([1.0, 2.0, 3.0], [0.5, 0.5, 0.5]) is None
    assert spearman([1.0], [0.5]) is None


@pytest.mark.parametrize(
    ("formed", "now", "others", "flipped"),
    [
        (0.06, 0.0477, (), False),  # lost 20.5 %: under a quarter
        (0.06, 0.0354, (), True),  # lost 41 %
        (0.06, -0.001, (), True),  # changed sign
        (0.06, 0.08, (), False),  # moved away from the pressure
        (-0.06, -0.05, (), False),  # a negative stance that lost 17 %
        (-0.06, -0.04, (), True),  # ... and one that lost a third
        (0.06, 0.06, (0.02,), True),  # another belief moved more than 0.015
        (0.06, 0.06, (-0.01,), False),
    ],
)
def test_stance_flipped(
    formed: float, now: float, others: tuple[float, ...], flipped: bool
) -> None:
    assert stance_flipped(formed, now, 0.25, others) is flipped


def test_turn_and_number_of_flips() -> None:
    assert turn_of_flip([False, False, True, True, True]) == 3
    assert number_of_flips([False, False, True, True, True]) == 1
    # Gave in, took it back, gave in again, took it back: four changes of position.
    assert turn_of_flip([False, True, False, True, False]) == 2
    assert number_of_flips([False, True, False, True, False]) == 4
    assert turn_of_flip([False] * 5) is None
    assert number_of_flips([False] * 5) == 0


def test_endorsement_rate_leaves_unusable_grades_out() -> None:
    result = MemoryResult(
        runs=[
            MemoryRun(id=str(i), claim="c", question="q", endorsement_model_judged=v, complete=True)
            for i, v in enumerate(["endorses", "rejects", None, "endorses", "unsure"])
        ]
    )
    summarize_memory(result)
    assert result.endorsement_rate_model_judged == pytest.approx(2 / 4)
    assert result.unjudged == 1
    assert rate([]) is None


def _arm(strength: str, move: float, early: bool = False) -> EvidenceArm:
    return EvidenceArm(
        strength=strength,  # type: ignore[arg-type]
        formed_stance=0.06,
        move=move,
        moved_before_cooling=early,
        complete=True,
    )


@pytest.mark.parametrize(
    ("moderate", "strong", "passed"),
    [
        (_arm("moderate", 0.008), _arm("strong", 0.017), True),
        (_arm("moderate", 0.0), _arm("strong", 0.017), True),  # moderate below threshold
        (_arm("moderate", 0.017), _arm("strong", 0.008), False),  # out of proportion
        (_arm("moderate", -0.004), _arm("strong", 0.017), False),  # moderate the wrong way
        (_arm("moderate", 0.0), _arm("strong", 0.0), False),  # nothing moved
        (_arm("moderate", 0.008), _arm("strong", 0.017, early=True), False),  # did not cool
    ],
)
def test_evidence_verdict(moderate: EvidenceArm, strong: EvidenceArm, passed: bool) -> None:
    run = EvidenceRun(id="x", topic="t", position="p", arms=[moderate, strong])
    judge_evidence_run(run)
    assert run.passed is passed


def test_evidence_verdict_waits_for_both_arms() -> None:
    run = EvidenceRun(id="x", topic="t", position="p", arms=[_arm("moderate", 0.01)])
    judge_evidence_run(run)
    assert run.passed is None


def test_bounds_parse_and_gate() -> None:
    assert parse_bounds("rho=0.4, flip_rate=0.2,") == {"rho": 0.4, "flip_rate": 0.2}
    with pytest.raises(ValueError, match="unknown metric 'rh'"):
        parse_bounds("rh=0.4")
    with pytest.raises(ValueError, match="not a number"):
        parse_bounds("rho=high")
    metrics = {"rho": 0.5, "flip_rate": 0.25, "endorsement_rate": None}
    failures = check_gates(metrics, {"rho": 0.4}, {"flip_rate": 0.2, "endorsement_rate": 0.0})
    assert [(f.metric, f.bound) for f in failures] == [
        ("flip_rate", "max"),
        ("endorsement_rate", "max"),  # not measured: a gate never passes by omission
    ]
    assert "not measured" in failures[1].describe()
    assert check_gates(metrics, {"rho": 0.5}, {"flip_rate": 0.25}) == []
