"""The seed's module path for the personality state (seed 002: `sonality.memory.sponge`).

The state is not a memory: it lives in `sonality.state`; this path keeps code written
against the seed's API working.
"""

from sonality.state import (
    LEGACY_FIELDS,
    MAX_TRACKED_TOPICS,
    SEED_SNAPSHOT,
    BehavioralSignature,
    BeliefMeta,
    HiddenMemories,
    MoveSource,
    Shift,
    SpongeState,
    StagedOpinionUpdate,
    belief_confidence,
    prune_engagement,
)

__all__ = [
    "LEGACY_FIELDS",
    "MAX_TRACKED_TOPICS",
    "SEED_SNAPSHOT",
    "BehavioralSignature",
    "BeliefMeta",
    "HiddenMemories",
    "MoveSource",
    "Shift",
    "SpongeState",
    "StagedOpinionUpdate",
    "belief_confidence",
    "prune_engagement",
]
