"""The persistence the engine needs, one instance per community, as an outbox.

`record_interaction` is durable before the reply leaves; `commit` writes a version with
everything it caused and acknowledges the outbox row in one transaction, so a crash in
between is replayed from `pending_interactions` exactly once.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from datetime import UTC, datetime
from typing import Any, Protocol

from pydantic import BaseModel, ConfigDict, Field

from sonality.evidence import EvidenceStep
from sonality.llm import Usage
from sonality.state import SpongeState


def utcnow() -> datetime:
    return datetime.now(UTC)


class Speaker(BaseModel):
    model_config = ConfigDict(frozen=True)

    id: str
    name: str


class InteractionRecord(BaseModel):
    """One answered message whose post-processing may still be pending (the outbox row)."""

    model_config = ConfigDict(frozen=True)

    id: str
    speaker: Speaker
    message: str
    reply: str
    created_at: datetime = Field(default_factory=utcnow)
    model: str = ""
    reply_usage: Usage = Field(default_factory=Usage)
    # The host's id of the message answered (a platform's message id), so the host can
    # find what was kept of it when the message is deleted or edited; "" when none.
    message_ref: str = ""


class AuditEvent(BaseModel):
    model_config = ConfigDict(frozen=True)

    kind: str
    interaction: int
    payload: dict[str, Any] = Field(default_factory=dict)
    created_at: datetime = Field(default_factory=utcnow)


class UsageRecord(BaseModel):
    model_config = ConfigDict(frozen=True)

    purpose: str
    model: str
    usage: Usage
    created_at: datetime = Field(default_factory=utcnow)


#: Failed learning attempts (other than model outages) after which the store parks a row.
MAX_LEARNING_ATTEMPTS = 3

#: (after, upto, from_version): memories of interactions after < n <= upto created
#: before from_version, which a rollback put out of reach.
HiddenRange = tuple[int, int, int]

EPISODIC = "episodic"
SEMANTIC = "semantic"


class Episode(BaseModel):
    """One memory. Its document is the ESS summary (an insight's text) and its vector
    the document's, so episodes and insights share one embedding space (see
    docs/performance.md for why the raw message is not embedded)."""

    model_config = ConfigDict(frozen=True)

    id: str
    user_message: str
    agent_response: str = ""
    ess_score: float = 0.0
    topics: tuple[str, ...] = ()
    summary: str = ""
    interaction: int = 0
    memory_type: str = EPISODIC
    # The version whose commit created it (0: unknown), so a rollback can hide it.
    version: int = 0
    # The document's vector if computed ahead; None: the store embeds it on write.
    embedding: tuple[float, ...] | None = None


class StateCommit(BaseModel):
    """Everything one state change writes, applied atomically."""

    state: SpongeState
    cause: str  # "seed" | "interaction" | "reflection" | "rollback" | "decay"
    change: str  # one line for humans: what changed in this version
    events: list[AuditEvent] = Field(default_factory=list)
    usage: list[UsageRecord] = Field(default_factory=list)
    # Memories to write after the commit (see `pending_episodes`).
    episodes: list[Episode] = Field(default_factory=list)
    interaction_id: str | None = None  # outbox row acknowledged by this commit
    actor: str | None = None  # who caused it, for moderator actions
    evidence: list[EvidenceStep] = Field(default_factory=list)


class VersionInfo(BaseModel):
    model_config = ConfigDict(frozen=True)

    version: int
    cause: str
    change: str
    interaction_count: int
    created_at: datetime
    actor: str | None = None


class BeingErased(BaseModel):
    """Log rows a deletion or forget-me under way, in this process or another, will
    erase once its replayed version is in: another replay meanwhile must leave them
    out. `members` maps a member being forgotten to the version that forgot them
    (None: not replayed yet, so every step of theirs goes)."""

    model_config = ConfigDict(frozen=True)

    interactions: frozenset[str] = frozenset()
    members: dict[str, int | None] = Field(default_factory=dict)


class LearningLease(Protocol):
    """The right to change one community's state (learn it, roll it back, forget a
    member in it): one holder at a time, each holder's changes ordered by its agent's
    lock. It dies with its holder's process."""

    @property
    def shared(self) -> bool:
        """Whether other processes take turns on it, and so commit to the store: then
        the state an agent holds can fall behind the stored one. False for a store only
        this process writes."""

    async def acquire(self) -> bool:
        """Take the lease if no other holder has it; never waits. A holder that takes
        it again while holding it (its learner during a moderator's change) is counted,
        and lets go with its last release."""

    async def release(self) -> None: ...


class LocalLease:
    """The `LearningLease` of a store only this process writes: a holder count in
    memory, so learning takes the same path as on a store several processes share.

    Leases made with one `holders` dict and one key are the same lease, so two stores
    opened on one community (an agent being closed while its successor loads) cannot
    learn it at once. The dict keeps only held keys.
    """

    shared = False

    def __init__(self, holders: dict[str, LocalLease] | None = None, key: str = "") -> None:
        self._holders: dict[str, LocalLease] = {} if holders is None else holders
        self._key = key
        self._count = 0

    async def acquire(self) -> bool:
        if self._holders.setdefault(self._key, self) is not self:
            return False
        self._count += 1
        return True

    async def release(self) -> None:
        if self._count == 0:
            return
        self._count -= 1
        if self._count == 0:
            del self._holders[self._key]


class StateStore(Protocol):
    """Durable state of one community's personality."""

    def learning_lease(self) -> LearningLease:
        """The lease its learners take turns on (`LocalLease` when this process is the
        store's only user)."""

    async def latest_version(self) -> int | None:
        """The newest committed version number, without rebuilding its state."""

    async def latest_state(self) -> SpongeState | None: ...

    async def state_at(self, version: int) -> SpongeState | None: ...

    async def versions(self, limit: int = 20, before: int | None = None) -> list[VersionInfo]:
        """Newest first."""

    async def record_interaction(self, record: InteractionRecord) -> bool:
        """Store an answered message; False (nothing stored) when its speaker ran
        forget-me after `record.created_at` (the reply was in flight) or is being
        forgotten now, or when the message (`record.message_ref`) was deleted since."""

    async def pending_interactions(self) -> list[InteractionRecord]:
        """Recorded but not yet committed interactions, oldest first (none of a member
        whose forget-me is under way: it is about to delete them)."""

    async def mark_interaction_failed(
        self, interaction_id: str, error: str, usage: Sequence[UsageRecord] = ()
    ) -> int:
        """Count a failed learning attempt and its tokens; returns attempts so far."""

    async def commit(self, commit: StateCommit) -> None: ...

    async def record_usage(self, usage: Sequence[UsageRecord]) -> None:
        """Record tokens of an attempt that will be retried."""

    async def pending_episodes(self) -> list[Episode]:
        """Committed episodes not yet confirmed written to memory, oldest first."""

    async def mark_episodes_written(self, episode_ids: list[str]) -> None: ...

    async def evidence(self, since_version: int = 0) -> list[EvidenceStep]:
        """The evidence log, in commit order (only the steps of `since_version` and
        later versions when given)."""

    async def learned_at(self, interaction_id: str) -> int | None:
        """The first version whose evidence holds a step of `interaction_id`; None if
        nothing was learned from it."""

    async def last_version_of(self, causes: Collection[str]) -> int:
        """The newest version committed with one of `causes` (0 if none)."""

    async def being_erased(self) -> BeingErased:
        """What unfinished deletions and forget-mes of this community will erase."""
