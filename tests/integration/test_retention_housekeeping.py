"""Housekeeping applies the retention settings, with a controllable clock."""

from __future__ import annotations

import sqlite3
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from pydantic import ValidationError

from app.wiring import open_runtime
from bot.scheduler import RETENTION_EVERY, ReflectionScheduler
from tests.integration.conftest import command, make_settings, say


def stored_messages(path: Path) -> list[tuple[str, str]]:
    with sqlite3.connect(path) as conn:
        return [
            (str(m), str(r)) for m, r in conn.execute("SELECT message, reply FROM interactions")
        ]


async def test_housekeeping_erases_old_message_text_hourly_and_keeps_history(
    tmp_path, llm, anthropic_server
):
    settings = make_settings(tmp_path / "data", SONALITY_MESSAGE_RETENTION_DAYS=30)
    async with open_runtime(settings, llm=llm) as runtime:
        await say(runtime, "remember my tea")
        now = datetime.now(UTC)
        scheduler = ReflectionScheduler(runtime, clock=lambda: now)
        path = settings.resolved_database_path

        await scheduler.run_housekeeping(now + timedelta(days=29))
        assert stored_messages(path)[0][0] == "remember my tea"

        await scheduler.run_housekeeping(now + timedelta(days=31))
        assert stored_messages(path) == [("", "")]
        # Ran at day 31: not again within the hour, again after it.
        soon = now + timedelta(days=31) + RETENTION_EVERY / 2
        assert await scheduler.run_retention(soon) is None
        later = await scheduler.run_retention(soon + RETENTION_EVERY)
        assert later is not None and later.total == 0

        # What people read is intact: the history and the state behind it.
        history = await command(runtime, "history", "all")
        assert "v1" in history.text
        snapshot = await command(runtime, "snapshot", "1")
        assert snapshot.ok and snapshot.text


def test_retention_settings_refuse_zero_days(tmp_path):
    for name in ("SONALITY_MESSAGE_RETENTION_DAYS", "SONALITY_AUDIT_RETENTION_DAYS"):
        with pytest.raises(ValidationError, match=name):
            make_settings(tmp_path, **{name: 0})
    defaults = make_settings(tmp_path)
    assert (defaults.message_retention_days, defaults.audit_retention_days) == (90, 365)
