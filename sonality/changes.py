"""A change's audit events, one-line description and evidence steps."""

from __future__ import annotations

import dataclasses
from typing import Any

from sonality import config
from sonality.ess import ESSResult
from sonality.evidence import DECAY, MESSAGE, EvidenceStep, RecordedESS
from sonality.reflection import ReflectionOutcome
from sonality.state import SpongeState
from sonality.store import AuditEvent, InteractionRecord


def recorded_ess(ess: ESSResult) -> RecordedESS:
    return RecordedESS(**dataclasses.asdict(ess))


def message_step(state: SpongeState, record: InteractionRecord, ess: ESSResult) -> EvidenceStep:
    return EvidenceStep(
        kind=MESSAGE,
        interaction=state.interaction_count,
        interaction_id=record.id,
        member=record.speaker.id,
        ess=recorded_ess(ess),
    )


def decay_step(state: SpongeState) -> EvidenceStep:
    return EvidenceStep(
        kind=DECAY, interaction=state.interaction_count, rate=config.BELIEF_DECAY_RATE
    )


def ess_event(
    state: SpongeState, record: InteractionRecord, ess: ESSResult, **outcome: Any
) -> AuditEvent:
    """One message's classification and what it did (`outcome`)."""
    return AuditEvent(
        kind="ess",
        interaction=state.interaction_count,
        payload={
            "interaction_id": record.id,
            "speaker": record.speaker.id,
            **recorded_ess(ess).model_dump(mode="json", exclude={"internal_consistency"}),
            **outcome,
        },
    )


def reflection_event(state: SpongeState, outcome: ReflectionOutcome) -> AuditEvent:
    return AuditEvent(
        kind="reflection",
        interaction=state.interaction_count,
        payload={
            "ran": outcome.ran,
            "accepted": outcome.accepted,
            "trigger": outcome.reason,
            "dropped_beliefs": list(outcome.dropped_beliefs),
            "old_chars": outcome.old_chars,
            "new_chars": outcome.new_chars,
            "error": outcome.error,
            "beliefs": len(state.opinion_vectors),
        },
    )


def describe_reflection(outcome: ReflectionOutcome) -> str:
    if not outcome.ran:
        base = f"reflection failed ({outcome.error})"
    elif outcome.accepted:
        base = (
            f"reflection ({outcome.reason}): narrative "
            f"{outcome.old_chars}->{outcome.new_chars} chars"
        )
    else:
        base = f"reflection ({outcome.reason}) rejected: {outcome.new_chars} chars too short"
    if outcome.dropped_beliefs:
        base += "; decayed away: " + ", ".join(outcome.dropped_beliefs)
    return base


def describe_interaction(
    ess: ESSResult,
    staged: list[dict[str, Any]],
    committed: list[str],
    insight: str | None,
    outcome: ReflectionOutcome | None,
) -> str:
    parts = [f"ESS {ess.score:.2f} {ess.reasoning_type}"]
    if staged:
        parts.append("staged " + ", ".join(f"{s['topic']} {s['delta']:+.3f}" for s in staged))
    if committed:
        parts.append("committed " + "; ".join(committed))
    if insight:
        parts.append("insight noted")
    if outcome is not None:
        parts.append(describe_reflection(outcome))
    return " | ".join(parts)
