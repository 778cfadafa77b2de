"""What one classified message does to the opinions (seed stages 5-6): pure functions,
so the agent and the forget-me replay run the same rules."""

from __future__ import annotations

from typing import Any

from sonality.config import EngineConfig, or_environment
from sonality.ess import ESSResult
from sonality.memory.updater import compute_magnitude
from sonality.prompts import prompt_label
from sonality.state import SpongeState

#: Beliefs (strongest first) shown to the ESS call for judging novelty.
VIEWS_FOR_ESS = 8


def views_for_ess(state: SpongeState) -> str:
    """The committed beliefs, against which ESS judges novelty (shorter than the
    narrative the seed sends)."""
    return state.belief_summary(limit=VIEWS_FOR_ESS) or "No settled views yet."


def update_topics(
    state: SpongeState, ess: ESSResult, *, config: EngineConfig | None = None
) -> None:
    """Count the message's topics in the topic engagement, only if the engine learns
    from the message: its ESS is above `config.ess_threshold` (the environment's when
    none is given), the bar that also gates opinion updates and insights.

    Why not every message, as the seed's pipeline does: the engagement is shown to
    the model in every member's prompt ("Top topics") and in reflection, and the
    labels come from the message. Counting low-rated messages would let a few
    greetings, bare assertions or repeated pressure (which the seed rates below 0.15
    however insistent) write text of the sender's choosing into everyone's prompt,
    against the seed's rule that only evidence shapes the personality. A forget-me
    replay calls this too, so both count alike.
    """
    if ess.score <= or_environment(config).ess_threshold:
        return
    for topic in ess.topics:
        state.track_topic(topic)


def disagrees(state: SpongeState, ess: ESSResult) -> bool:
    """The user argues against a stance the agent holds."""
    sign = ess.opinion_direction.sign
    return sign != 0 and any(state.opinion_vectors.get(t, 0.0) * sign < 0 for t in ess.topics)


def apply_due(state: SpongeState) -> list[str]:
    """Commit the due staged updates and record them as shifts."""
    before = dict(state.opinion_vectors)
    applied = state.apply_due_staged_updates()
    for topic, value in state.opinion_vectors.items():
        moved = abs(value - before.get(topic, 0.0))
        if moved > 0:
            # A note for reflection's prompt: the label bounded like everywhere there.
            change = f"{before.get(topic, 0.0):+.3f} -> {value:+.3f}"
            state.record_shift(f"{prompt_label(topic)}: {change}", moved)
    return applied


def resisted(magnitude: float, confidence: float, against: float = 0.0) -> float:
    """Bayesian resistance: a step shrinks with confidence, and an argument against a
    stance also with that stance's strength `against`."""
    return magnitude / (confidence + against + 1.0)


def update_opinions(
    state: SpongeState,
    ess: ESSResult,
    *,
    interaction_id: str = "",
    member: str = "",
    version: int = 0,
    config: EngineConfig | None = None,
) -> list[dict[str, Any]]:
    """Stage `resisted` moves for strong, directional evidence, by `config`'s rules
    (the environment's when none is given); each keeps its source for credit and
    forget-me."""
    config = or_environment(config)
    sign = ess.opinion_direction.sign
    if not (ess.score > config.ess_threshold and ess.topics and sign != 0):
        return []
    magnitude = compute_magnitude(ess, state, config=config)
    staged: list[dict[str, Any]] = []
    for topic in ess.topics:
        old = state.opinion_vectors.get(topic, 0.0)
        meta = state.belief_meta.get(topic)
        confidence = meta.confidence if meta else 0.0
        effective = resisted(magnitude, confidence, abs(old) if old * sign < 0 else 0.0)
        due = state.stage_opinion_update(
            topic,
            sign,
            effective,
            config.opinion_cooling_period,
            provenance=f"ESS {ess.score:.2f}: {ess.summary[:160]}",
            interaction_id=interaction_id,
            member=member,
            version=version,
        )
        staged.append({"topic": topic, "delta": round(sign * effective, 6), "due": due})
    return staged


def structured_traits(state: SpongeState) -> str:
    """The seed's numeric summary, plus the moves still cooling; topic labels are cut
    to `prompt_label`'s bound (they came from members' messages)."""
    lines = [f"Style: {state.tone}"]
    engagement = state.behavioral_signature.topic_engagement
    if engagement:
        top = sorted(engagement.items(), key=lambda kv: (-kv[1], kv[0]))[:5]
        lines.append("Top topics: " + ", ".join(f"{prompt_label(t)}({n})" for t, n in top))
    if state.opinion_vectors:
        ranked = sorted(state.opinion_vectors.items(), key=lambda kv: (-abs(kv[1]), kv[0]))
        parts = []
        for topic, value in ranked[:5]:
            meta = state.belief_meta.get(topic)
            conf = meta.confidence if meta else 0.0
            parts.append(f"{prompt_label(topic)}={value:+.2f} c={conf:.1f}")
        lines.append("Strongest opinions: " + ", ".join(parts))
    if state.staged_opinion_updates:
        pending = ", ".join(
            f"{prompt_label(u.topic)}({u.signed_magnitude:+.3f})"
            for u in state.staged_opinion_updates[:5]
        )
        lines.append(f"Still weighing: {pending}")
    lines.append(f"Disagreement rate: {state.behavioral_signature.disagreement_rate:.0%}")
    return "\n".join(lines)
