"""Rollback: an earlier version restored as a new version, so a rollback can be undone."""

from __future__ import annotations

from sonality.state import HiddenMemories, SpongeState


class RollbackError(ValueError):
    """A rollback target that does not exist."""


def rebase(state: SpongeState, interaction_count: int) -> SpongeState:
    """A copy of `state` moved to `interaction_count`, with every interaction-relative
    field shifted alike, so decay gaps and cooling periods are kept."""
    restored = state.model_copy(deep=True)
    offset = interaction_count - restored.interaction_count
    restored.interaction_count = interaction_count
    if restored.last_reflection_at:  # 0 is "never reflected", which stays true
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
    """`target` as the version after `current`, with the memories formed since hidden;
    restoring a later version again brings back what it could recall."""
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
