"""Persistence for the bot: the only package that speaks SQL.

`Database` is the one SQLite file of a bot process; `Database.community(id)` gives the
engine its `StateStore` (a `CommunityStore`) for one community.
"""

from storage.community import MAX_INTERACTION_ATTEMPTS, CommunityStore
from storage.db import Database
from storage.models import (
    USAGE_ROLES,
    BudgetOverride,
    CommunityInfo,
    DailyUsage,
    InteractionAlreadyDoneError,
    ModeratorAction,
    SchemaTooNewError,
    StorageError,
    StoredAuditEvent,
    UnknownInteractionError,
    UsageRole,
    UsageTotals,
    VersionConflictError,
)
from storage.retention import RetentionPolicy, RetentionReport

__all__ = [
    "MAX_INTERACTION_ATTEMPTS",
    "USAGE_ROLES",
    "BudgetOverride",
    "CommunityInfo",
    "CommunityStore",
    "DailyUsage",
    "Database",
    "InteractionAlreadyDoneError",
    "ModeratorAction",
    "RetentionPolicy",
    "RetentionReport",
    "SchemaTooNewError",
    "StorageError",
    "StoredAuditEvent",
    "UnknownInteractionError",
    "UsageRole",
    "UsageTotals",
    "VersionConflictError",
]
