"""The seed's module path for the personality state (seed 002: `sonality.memory.sponge`).

The state is not a memory: it lives in `sonality.state`; this path keeps code written
against the seed's API working, and so re-exports the seed's names only.
"""

from sonality.state import (
    SEED_SNAPSHOT,
    BehavioralSignature,
    BeliefMeta,
    Shift,
    SpongeState,
    StagedOpinionUpdate,
)

__all__ = [
    "SEED_SNAPSHOT",
    "BehavioralSignature",
    "BeliefMeta",
    "Shift",
    "SpongeState",
    "StagedOpinionUpdate",
]
