"""Data shapes storage hands back, and its errors.

Callers get validated, frozen pydantic models instead of raw rows so nothing outside
`storage` depends on column order or on how a value is encoded in SQLite.
"""

from __future__ import annotations

from datetime import date, datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from sonality.llm import Usage

Role = Literal["user", "assistant"]

UsageRole = Literal["reply", "evidence", "reflection"]
"""What an LLM call was for, as spending is reported: the answer people wait for, the
evidence work behind it (ESS and insight extraction) and reflection."""

USAGE_ROLES: tuple[UsageRole, ...] = ("reply", "evidence", "reflection")


def usage_role(purpose: str) -> UsageRole:
    """The role of an LLM call's `purpose` ("reply", "ess", "insight", "reflection").

    Any other purpose is background work on a message, so it counts as evidence. The
    migration that built `usage_daily` from the old per-call rows uses the same rule.
    """
    if purpose in ("reply", "reflection"):
        return purpose  # type: ignore[return-value]
    return "evidence"


class StorageError(RuntimeError):
    """Base class of every error raised on purpose by `storage`."""


class IntegrityViolation(StorageError):
    """The database refused a write: a key already taken, a broken reference, or one of
    the schema's guards (versions are append-only, a patch must extend its chain).

    One class for both engines, so callers and tests see the same error whether SQLite
    or PostgreSQL refused; the engine's own exception is kept as ``__cause__``.
    """


class SchemaTooNewError(StorageError):
    """The database file was migrated by a newer release; refusing to touch it."""


class VersionConflictError(StorageError, ValueError):
    """A commit's state.version is not exactly latest+1 (or 0 for a new community).

    Raised before anything is written: two writers raced, or a caller built the new
    state from a stale one. Reload `latest_state()` and redo the change.
    """


class UnknownInteractionError(StorageError, LookupError):
    """The outbox has no such interaction for this community."""


class InteractionAlreadyDoneError(StorageError):
    """A commit tried to acknowledge an outbox row that an earlier commit already acked.

    Processing the same interaction twice would double-count its effect on the
    personality, so the whole commit is refused.
    """


class StoredAuditEvent(BaseModel):
    """An audit event as stored, with the version it belongs to."""

    model_config = ConfigDict(frozen=True)

    version: int
    kind: str
    interaction: int
    payload: dict[str, Any] = Field(default_factory=dict)
    created_at: datetime


class UsageTotals(BaseModel):
    """Summed token usage of one community (all time, or over a range of days)."""

    model_config = ConfigDict(frozen=True)

    usage: Usage = Field(default_factory=Usage)
    calls: int = 0
    by_role: dict[UsageRole, Usage] = Field(default_factory=dict)

    @property
    def input_tokens(self) -> int:
        return self.usage.input_tokens

    @property
    def output_tokens(self) -> int:
        return self.usage.output_tokens

    @property
    def cache_read_tokens(self) -> int:
        return self.usage.cache_read_tokens

    @property
    def cache_write_tokens(self) -> int:
        return self.usage.cache_write_tokens


class DailyUsage(BaseModel):
    """One row of the daily rollup: a community's calls of one role and model on one
    local day (SONALITY_TIMEZONE)."""

    model_config = ConfigDict(frozen=True)

    day: date
    role: UsageRole
    model: str
    calls: int
    usage: Usage


class BudgetOverride(BaseModel):
    """A community's own daily spending limit, set by a moderator.

    `daily_limit_usd` None means "no limit", even when SONALITY_DAILY_BUDGET_USD sets a
    default; a community without an override follows that default.
    """

    model_config = ConfigDict(frozen=True)

    community_id: str
    daily_limit_usd: float | None
    set_by: str
    set_at: datetime


class ModeratorAction(BaseModel):
    """One moderator command attempt; refused attempts are kept too (allowed=False)."""

    model_config = ConfigDict(frozen=True)

    community_id: str
    actor_id: str
    actor_name: str
    action: str
    args: str = ""  # as typed, e.g. "12 spam wave"
    reason: str = ""
    allowed: bool
    created_at: datetime


class CommunityInfo(BaseModel):
    model_config = ConfigDict(frozen=True)

    id: str
    platform: str
    name: str
    created_at: datetime
    last_activity_at: datetime | None = None
    last_reflection_time: datetime | None = None
