"""Recompute a community's opinions from its evidence log, leaving some members out.

Why: "forget me" must undo a member's influence, not only delete their words. The
update rules are deterministic, so replaying the recorded evidence (`sonality.evidence`)
from the seed, in order, without the forgotten member's messages gives exactly the
opinions the community would hold had those messages never been sent: the remaining
messages are counted, cooled, netted and resisted as they would have been, and beliefs
decay at the recorded reflection points (each after the messages that preceded it).

Nothing here is a copy of a rule: each message goes through the agent's own steps
(`sonality.opinions`, in the order of `SonalityAgent._post_process`), decay through
`SpongeState.decay_beliefs`, a rollback through `sonality.rollback.rebase`. The rules'
tunables are read from `sonality.config` at replay time, so a replay matches the record
only while they are unchanged (the log keeps the decay rate of each decay, the one
tunable a reflection takes as an argument).

Only opinions and their bookkeeping (stances, belief metadata, staged updates, the
interaction count, topic engagement, disagreement rate) are recomputed; the caller keeps
the narrative and everything else from the current state. The replay is pure: no LLM,
no store, no clock apart from the timestamps of recorded shifts.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable

from sonality.ess import ESSResult, OpinionDirection, ReasoningType, SourceReliability
from sonality.evidence import DECAY, MESSAGE, ROLLBACK, EvidenceStep, RecordedESS
from sonality.memory.sponge import SpongeState
from sonality.opinions import apply_due, disagrees, update_opinions, update_topics
from sonality.rollback import rebase


class ReplayError(ValueError):
    """The evidence log cannot be replayed (for example a rollback to an unknown state)."""


def ess_of(recorded: RecordedESS) -> ESSResult:
    """The ESS result the rules saw, rebuilt from the log."""
    return ESSResult(
        score=recorded.score,
        reasoning_type=ReasoningType(recorded.reasoning_type),
        source_reliability=SourceReliability(recorded.source_reliability),
        internal_consistency=recorded.internal_consistency,
        novelty=recorded.novelty,
        topics=tuple(recorded.topics),
        summary=recorded.summary,
        opinion_direction=OpinionDirection(recorded.opinion_direction),
        used_defaults=recorded.used_defaults,
    )


def apply_message(state: SpongeState, step: EvidenceStep) -> None:
    """One learned message, exactly as `SonalityAgent._post_process` applies it."""
    if step.ess is None:
        raise ReplayError(f"message step {step.interaction_id!r} has no ESS result")
    ess = ess_of(step.ess)
    state.interaction_count += 1
    update_topics(state, ess)
    disagreed = disagrees(state, ess)
    # Skipping the call when nothing is due changes nothing (it would commit nothing and
    # record no shift) and saves most of its cost on a long log.
    if any(u.due_interaction <= state.interaction_count for u in state.staged_opinion_updates):
        apply_due(state)
    update_opinions(
        state,
        ess,
        interaction_id=step.interaction_id,
        member=step.member,
        version=step.version,
    )
    state.track_disagreement(disagreed)


def replay(
    steps: Iterable[EvidenceStep],
    *,
    without_members: Collection[str] = (),
    without_interactions: Collection[str] = (),
    seed: SpongeState | None = None,
) -> SpongeState:
    """The opinions after `steps`, from `seed` (the seed personality by default), with
    the messages of `without_members` and the interactions `without_interactions` left
    out as if never sent.

    A rollback restores the replayed state as of its target version (every step
    recorded at or before that version), rebased to the current interaction count as the
    agent does, so evidence a moderator undid stays undone in the replay too.
    """
    members = set(without_members)
    interactions = set(without_interactions)
    ordered = list(steps)
    targets = sorted({s.target_version for s in ordered if s.kind == ROLLBACK}, reverse=True)
    saved: dict[int, SpongeState] = {}
    state = (seed or SpongeState()).model_copy(deep=True)
    for step in ordered:
        # States at rollback targets: the state before the first step of a later version.
        while targets and targets[-1] < step.version:
            saved[targets.pop()] = state.model_copy(deep=True)
        if step.kind == MESSAGE:
            if step.member in members or step.interaction_id in interactions:
                continue
            apply_message(state, step)
        elif step.kind == DECAY:
            state.decay_beliefs(step.rate)
        elif step.kind == ROLLBACK:
            target = saved.get(step.target_version)
            if target is None:
                raise ReplayError(f"rollback to v{step.target_version} before it was replayed")
            state = rebase(target, state.interaction_count)
    return state


def forgotten(
    steps: Iterable[EvidenceStep],
    current: SpongeState,
    without_members: Collection[str],
    drop_insights: Collection[str],
) -> tuple[SpongeState, list[str]]:
    """The version after `current` with the opinions the log gives without
    `without_members` (rebased to the current interaction count, as a rollback is), and
    the topics whose stance changed.

    The narrative stays until the next reflection; the pending insights drawn from the
    members' messages (`drop_insights`) are dropped so that reflection cannot bring
    their words back.
    """
    replayed = rebase(replay(steps, without_members=without_members), current.interaction_count)
    state = current.model_copy(deep=True)
    state.opinion_vectors = replayed.opinion_vectors
    state.belief_meta = replayed.belief_meta
    state.staged_opinion_updates = replayed.staged_opinion_updates
    drop = set(drop_insights)
    state.pending_insights = [i for i in state.pending_insights if i not in drop]
    state.version = current.version + 1
    moved = sorted(
        t
        for t in set(current.opinion_vectors) | set(state.opinion_vectors)
        if current.opinion_vectors.get(t) != state.opinion_vectors.get(t)
    )
    return state, moved
