"""The persistence interface the engine depends on, one instance per community.

Why a protocol: the engine must survive a crash between "reply sent" and "personality
updated" without knowing what database sits underneath. The contract is an outbox:
`record_interaction` is durable before the reply leaves, and `commit` writes the new
state version, its audit events, its token usage and the outbox acknowledgement in one
transaction. Anything recorded but not committed is handed back by
`pending_interactions` on the next start and processed exactly once.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any, Protocol

from pydantic import BaseModel, ConfigDict, Field

from sonality.evidence import EvidenceStep
from sonality.llm import Usage
from sonality.memory.sponge import SpongeState


def utcnow() -> datetime:
    return datetime.now(UTC)


class Speaker(BaseModel):
    """Who said something, in platform-neutral form."""

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


class AuditEvent(BaseModel):
    """An entry of the audit trail (ESS classification, reflection, rollback, ...)."""

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


#: Attempts at learning one interaction that failed for a reason other than the model
#: being unavailable; after this many the store parks it (status 'failed').
MAX_LEARNING_ATTEMPTS = 3

#: Memories a rollback put out of reach: those of interactions `after < n <= upto` that
#: were created before version `from_version` (later ones, even at the same interaction
#: count, stay visible).
HiddenRange = tuple[int, int, int]

EPISODIC = "episodic"
SEMANTIC = "semantic"


class Episode(BaseModel):
    """One memory as stored in Chroma.

    The document is the ESS summary (for an insight, its text), and the vector is the
    document's embedding. So every memory, learned live, replayed after a restart or
    distilled by reflection, lives in one embedding space and is ranked against the same
    `min_relevance`. The member's raw message is not embedded, though the reply path has
    its vector at hand: a small evaluation found summaries recall as well
    (tests/memory/test_retrieval_space.py), insights have nothing else, and a vector of
    the raw words would outlive them once retention deletes the message (embeddings can
    be partly inverted), whereas the summary is kept with its vector anyway. (When
    classification fails, the summary says only that, `sonality.ess.fallback_summary`;
    releases before 2026-11-24 used the message's first words.) The price is one more
    embedding per message, in the background.
    """

    model_config = ConfigDict(frozen=True)

    id: str
    user_message: str
    agent_response: str = ""
    ess_score: float = 0.0
    topics: tuple[str, ...] = ()
    summary: str = ""
    interaction: int = 0
    memory_type: str = EPISODIC
    # The personality version whose commit created it (0: unknown, before versions were
    # recorded), so a rollback can tell what came before it.
    version: int = 0
    # The document's vector, when computed ahead (the agent does before committing, so
    # an episode waiting for its batched write is ranked in memory). None: the store
    # embeds the document when it writes the episode.
    embedding: tuple[float, ...] | None = None


class StateCommit(BaseModel):
    """Everything one state change writes, applied atomically by the store."""

    state: SpongeState
    cause: str  # "seed" | "interaction" | "reflection" | "rollback" | "decay"
    change: str  # one line for humans: what changed in this version
    events: list[AuditEvent] = Field(default_factory=list)
    usage: list[UsageRecord] = Field(default_factory=list)
    # Memories to write to Chroma after the commit (write-behind, see `pending_episodes`).
    episodes: list[Episode] = Field(default_factory=list)
    interaction_id: str | None = None  # outbox row acknowledged by this commit
    actor: str | None = None  # who caused it, for moderator actions
    # What a replay of the opinions needs from this commit (see sonality.evidence).
    evidence: list[EvidenceStep] = Field(default_factory=list)


class VersionInfo(BaseModel):
    model_config = ConfigDict(frozen=True)

    version: int
    cause: str
    change: str
    interaction_count: int
    created_at: datetime
    actor: str | None = None


class LearningLease(Protocol):
    """The right to change one community's state, when several processes share a store.

    Whoever holds it learns the community's outbox (every process's answered messages,
    in the store's order) and runs its other changes; it goes away with the holder's
    process, so another process can take over what a dead one left.
    """

    async def acquire(self) -> bool:
        """Take the lease if no other process holds it; never waits."""
        ...

    async def release(self) -> None: ...


class StateStore(Protocol):
    """Durable state of one community's personality."""

    def learning_lease(self) -> LearningLease | None:
        """None when this process is the store's only user; else the lease processes
        take turns on (see `sonality.learning`)."""
        ...

    async def latest_version(self) -> int | None:
        """The newest committed version number (cheap: no state is rebuilt)."""
        ...

    async def latest_state(self) -> SpongeState | None:
        """The newest committed state, or None for a community never seen."""
        ...

    async def state_at(self, version: int) -> SpongeState | None: ...

    async def versions(self, limit: int = 20, before: int | None = None) -> list[VersionInfo]:
        """Newest first."""
        ...

    async def record_interaction(self, record: InteractionRecord) -> None:
        """Durably note an answered message before its reply is delivered."""
        ...

    async def pending_interactions(self) -> list[InteractionRecord]:
        """Recorded but not yet committed interactions, oldest first."""
        ...

    async def mark_interaction_failed(
        self, interaction_id: str, error: str, usage: Sequence[UsageRecord] = ()
    ) -> int:
        """Count a failed post-processing attempt, and the tokens it spent; returns
        attempts so far.

        After too many attempts the store stops returning it as pending.
        """
        ...

    async def commit(self, commit: StateCommit) -> None:
        """Append the new version + events + usage + episodes, ack the outbox row: atomically."""
        ...

    async def record_usage(self, usage: Sequence[UsageRecord]) -> None:
        """Record tokens spent outside a commit (a learning attempt that waits for the
        model and will be retried), so no call vanishes from the community's spend."""
        ...

    async def pending_episodes(self) -> list[Episode]:
        """Committed episodes not yet confirmed written to the vector store, oldest first.

        Vector-store writes block every reader in the process, so they happen after the
        commit, batched, when no reply is waiting; until confirmed they stay here and are
        written again after a crash (the write is an idempotent upsert by id).
        """
        ...

    async def mark_episodes_written(self, episode_ids: list[str]) -> None: ...

    async def evidence(self) -> list[EvidenceStep]:
        """The community's evidence log, in commit order (see `sonality.evidence`)."""
        ...
