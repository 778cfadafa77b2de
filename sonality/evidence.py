"""The evidence log: what an exact replay of the opinions needs (`sonality.replay`).

Kept apart from the audit trail, which retention prunes. Plain fields only: this sits
below `sonality.store`, which `sonality.ess` imports.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict

MESSAGE: Literal["message"] = "message"
DECAY: Literal["decay"] = "decay"
ROLLBACK: Literal["rollback"] = "rollback"

StepKind = Literal["message", "decay", "rollback"]


class RecordedESS(BaseModel):
    """The `ESSResult` fields as the rules saw them."""

    model_config = ConfigDict(frozen=True)

    score: float
    reasoning_type: str
    source_reliability: str
    internal_consistency: bool
    novelty: float
    topics: tuple[str, ...]
    summary: str
    opinion_direction: str
    used_defaults: bool = False


class EvidenceStep(BaseModel):
    """A learned message (`ess`, `member`), a decay at `rate`, or a rollback to
    `target_version`; `interaction` is the count after it, `version` its commit's."""

    model_config = ConfigDict(frozen=True)

    kind: StepKind
    interaction: int
    version: int = 0
    interaction_id: str = ""
    member: str = ""
    ess: RecordedESS | None = None
    rate: float = 0.0
    target_version: int = 0
