"""Retention end to end (issue 11, item 5): the real runtime learns two messages, and
housekeeping, run at a chosen time, leaves none of the older one's words in any
SQLite table, while the personality's history stays."""

from __future__ import annotations

import sqlite3
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from app.wiring import open_runtime
from bot.scheduler import ReflectionScheduler
from tests.integration.conftest import ALICE, BOB, command, make_settings, say

OLD = "marmosetquartz"
NEW = "ocelotbasalt"


def rows_with(path: Path, word: str) -> list[str]:
    with sqlite3.connect(path) as conn:
        tables = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
        return [
            f"{table}: {row}"
            for table in tables
            for row in conn.execute(f'SELECT * FROM "{table}"')
            if any(word in str(value) for value in row)
        ]


async def test_housekeeping_leaves_no_old_words_in_any_table(
    tmp_path: Path, llm: Any, anthropic_server: Any
) -> None:
    settings = make_settings(
        tmp_path / "data",
        SONALITY_MESSAGE_RETENTION_DAYS=30,
        SONALITY_BUFFER_TTL_MINUTES=60 * 24 * 365,  # the buffer alone would keep them
    )
    # The model summarises as the prompt asks (the fake's default quotes the message).
    for word in (OLD, NEW):
        anthropic_server.brain.ess_rule(
            contains=word, score=0.2, summary="The sender names a pet; no argument."
        )
    async with open_runtime(settings, llm=llm) as runtime:
        path = settings.resolved_database_path
        await say(runtime, f"my cat is called {OLD}", user=ALICE)
        start = datetime.now(UTC)
        scheduler = ReflectionScheduler(runtime, clock=lambda: start)
        assert rows_with(path, OLD)

        await say(runtime, f"my dog is called {NEW}", user=BOB)
        await scheduler.run_housekeeping(start + timedelta(days=29))
        assert rows_with(path, OLD) and rows_with(path, NEW)  # younger than 30 days
        # Retention runs hourly: the next run, 31 days on (both are old by then; that a
        # younger message stays is tests/storage/test_retention_texts.py).
        await scheduler.run_housekeeping(start + timedelta(days=31))
        assert rows_with(path, OLD) == [] and rows_with(path, NEW) == []
        history = await command(runtime, "history", "all")
        assert "v1" in history.text and "v2" in history.text
