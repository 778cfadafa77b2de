"""Persistence for the bot: the only package that speaks SQL.

`Database` is the bot's state: one SQLite file by default, or a PostgreSQL database when
DATABASE_URL is set (`open_database` picks); `Database.community(id)` gives the engine
its `StateStore` (a `CommunityStore`) for one community.
"""

from storage.community import MAX_INTERACTION_ATTEMPTS, CommunityStore
from storage.db import Database, open_database
from storage.models import (
    USAGE_ROLES,
    BudgetOverride,
    CommunityInfo,
    DailyUsage,
    IntegrityViolation,
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
    "IntegrityViolation",
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
    "open_database",
]
