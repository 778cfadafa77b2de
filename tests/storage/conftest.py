"""Shared fixtures: every test gets its own database file under tmp_path."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from sonality.llm import Usage
from sonality.memory.sponge import SpongeState
from sonality.store import (
    AuditEvent,
    Episode,
    InteractionRecord,
    Speaker,
    StateCommit,
    UsageRecord,
)
from storage import Database

T0 = datetime(2025, 1, 1, 12, 0, tzinfo=UTC)


def at(minutes: float) -> datetime:
    return T0 + timedelta(minutes=minutes)


def state(version: int) -> SpongeState:
    return SpongeState(version=version, interaction_count=version)


def commit_of(
    version: int,
    *,
    interaction_id: str | None = None,
    cause: str = "interaction",
    events: list[AuditEvent] | None = None,
    usage: list[UsageRecord] | None = None,
) -> StateCommit:
    """A commit of an otherwise default state at `version`."""
    return StateCommit(
        state=state(version),
        cause=cause,
        change=f"v{version}",
        events=events or [],
        usage=usage or [],
        interaction_id=interaction_id,
    )


def record(interaction_id: str, message: str = "hi", minutes: float = 0) -> InteractionRecord:
    return InteractionRecord(
        id=interaction_id,
        speaker=Speaker(id="u1", name="Ada"),
        message=message,
        reply=f"reply to {message}",
        created_at=at(minutes),
        model="test-model",
        reply_usage=Usage(input_tokens=10, output_tokens=5, cache_read_tokens=2),
    )


def episode(eid: str, **fields: Any) -> Episode:
    return Episode(id=eid, user_message=f"message {eid}", summary=f"summary {eid}", **fields)


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    return tmp_path / "nested" / "dir" / "bot.sqlite3"


@pytest.fixture
async def db(db_path: Path) -> AsyncIterator[Database]:
    database = await Database.open(db_path)
    try:
        yield database
    finally:
        await database.close()
