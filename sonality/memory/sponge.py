"""The personality state ("sponge"): narrative, opinions, beliefs and their bookkeeping.

SKELETON: the data shapes are fixed here (storage and the agent depend on them);
the methods are being implemented per seed 002.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

SEED_SNAPSHOT = "TODO"


class BeliefMeta(BaseModel):
    model_config = ConfigDict(extra="ignore")

    confidence: float = 0.0
    evidence_count: int = 1
    last_reinforced: int = 0
    provenance: str = ""


class BehavioralSignature(BaseModel):
    model_config = ConfigDict(extra="ignore")

    disagreement_rate: float = 0.0
    topic_engagement: dict[str, int] = Field(default_factory=dict)


class Shift(BaseModel):
    model_config = ConfigDict(extra="ignore")

    interaction: int
    timestamp: str
    description: str
    magnitude: float


class StagedOpinionUpdate(BaseModel):
    model_config = ConfigDict(extra="ignore")

    topic: str
    signed_magnitude: float
    staged_at: int
    due_interaction: int
    provenance: str = ""


class SpongeState(BaseModel):
    model_config = ConfigDict(extra="ignore")

    version: int = 0
    interaction_count: int = 0
    snapshot: str = SEED_SNAPSHOT
    opinion_vectors: dict[str, float] = Field(default_factory=dict)
    belief_meta: dict[str, BeliefMeta] = Field(default_factory=dict)
    tone: str = "curious, direct, unpretentious"
    behavioral_signature: BehavioralSignature = Field(default_factory=BehavioralSignature)
    recent_shifts: list[Shift] = Field(default_factory=list)
    pending_insights: list[str] = Field(default_factory=list)
    staged_opinion_updates: list[StagedOpinionUpdate] = Field(default_factory=list)
    last_reflection_at: int = 0
