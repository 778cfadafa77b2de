"""Persistence for the bot: the only package that speaks SQL.

`Database` is the one SQLite file of a bot process; `Database.community(id)` gives the
engine its `StateStore` (a `CommunityStore`) for one community.
"""

from storage.community import MAX_INTERACTION_ATTEMPTS, CommunityStore
from storage.db import Database
from storage.models import (
    CommunityInfo,
    InteractionAlreadyDoneError,
    ModeratorAction,
    SchemaTooNewError,
    StorageError,
    StoredAuditEvent,
    UnknownInteractionError,
    UsageTotals,
    VersionConflictError,
)

__all__ = [
    "MAX_INTERACTION_ATTEMPTS",
    "CommunityInfo",
    "CommunityStore",
    "Database",
    "InteractionAlreadyDoneError",
    "ModeratorAction",
    "SchemaTooNewError",
    "StorageError",
    "StoredAuditEvent",
    "UnknownInteractionError",
    "UsageTotals",
    "VersionConflictError",
]
