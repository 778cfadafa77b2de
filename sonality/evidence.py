"""The evidence log: what an exact replay of a community's opinions needs, in order.

Why a record of its own, beside the versions and the audit trail: forgetting a member
must undo their influence, which means recomputing the opinions from the seed as if
their messages had never been sent (`sonality/replay.py`). The update rules are
deterministic, so the replay is exact given, in commit order, every learned message's
ESS result and speaker, and every point where beliefs decayed with the rate used. The
versions hold only states and the audit trail may be pruned by retention, so each
commit also hands the store these steps, which it keeps until the community (or, for a
member's own steps, a forget-me) deletes them.

Plain fields only: this module sits below `sonality.store`, which the ESS module itself
imports, so it cannot refer to `ESSResult` (the replay converts, see `RecordedESS`).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict

MESSAGE: Literal["message"] = "message"
DECAY: Literal["decay"] = "decay"
ROLLBACK: Literal["rollback"] = "rollback"

StepKind = Literal["message", "decay", "rollback"]


class RecordedESS(BaseModel):
    """An ESS result exactly as the update rules saw it (the `ESSResult` fields)."""

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
    """One step of a community's opinion history.

    - "message": one learned interaction (`interaction_id`, its speaker `member`, `ess`);
      the interaction count went up by one and the rules ran on it.
    - "decay": beliefs decayed at `rate` (the decay step of a reflection), after every
      message before it.
    - "rollback": the state was restored to `target_version` (kept so a replay can tell
      which evidence a moderator undid).
    `interaction` is the interaction count right after the step; `version` the version
    whose commit recorded it (the store fills it in from the commit).
    """

    model_config = ConfigDict(frozen=True)

    kind: StepKind
    interaction: int
    version: int = 0
    interaction_id: str = ""
    member: str = ""
    ess: RecordedESS | None = None
    rate: float = 0.0
    target_version: int = 0
