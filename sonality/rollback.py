"""Rollback: an earlier version restored as a new version, so a rollback can be undone."""

from __future__ import annotations

from sonality.memory.sponge import HiddenMemories, SpongeState


class RollbackError(ValueError):
    """A rollback target that does not exist."""


def rebase(state: SpongeState, interaction_count: int) -> SpongeState:
    """A copy of `state` at `interaction_count`: the interaction counter stays monotonic,
    and interaction-relative fields move by the same offset, so decay gaps and cooling
    periods are exactly what they were."""
    restored = state.model_copy(deep=True)
    offset = interaction_count - restored.interaction_count
    restored.interaction_count = interaction_count
    restored.last_reflection_at += offset
    for meta in restored.belief_meta.values():
        meta.last_reinforced += offset
    for update in restored.staged_opinion_updates:
        update.staged_at += offset
        update.due_interaction += offset
    for shift in restored.recent_shifts:
        shift.interaction += offset
    return restored


def restore(target: SpongeState, current: SpongeState) -> SpongeState:
    """`target` as the version after `current`.

    Memories formed after the restored version are put out of reach with it (`rollback
    0` forgets them all); restoring a later version brings back what it could recall,
    since each version keeps its own ranges.
    """
    restored = rebase(target, current.interaction_count)
    restored.version = current.version + 1
    if restored.interaction_count > target.interaction_count:
        restored.hidden_memories.append(
            HiddenMemories(
                after=target.interaction_count,
                upto=restored.interaction_count,
                from_version=restored.version,
            )
        )
    return restored
