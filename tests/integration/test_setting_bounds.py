"""A "keep it forever" setting: the largest value it may take still leaves retention and
replies working (a value past it is refused at start: test_startup.py).

Before the upper bounds, SONALITY_AUDIT_RETENTION_DAYS=999999 made the hourly retention
raise OverflowError before it deleted anything (so message retention stopped too), and
SONALITY_BUFFER_TTL_MINUTES=1e10 made every reply "Sorry, something went wrong".
"""

from __future__ import annotations

import sqlite3
from datetime import UTC, datetime, timedelta
from pathlib import Path

from app.wiring import open_runtime
from bot.scheduler import ReflectionScheduler
from bot.settings import MAX_DAYS, MAX_MINUTES
from sonality.llm import LLMClient
from tests.integration.conftest import make_settings, say


def stored_messages(path: Path) -> list[tuple[str, str]]:
    with sqlite3.connect(path) as conn:
        return [
            (str(m), str(r)) for m, r in conn.execute("SELECT message, reply FROM interactions")
        ]


async def test_at_the_largest_allowed_values_retention_erases_and_the_bot_answers(
    tmp_path: Path, llm: LLMClient
) -> None:
    settings = make_settings(
        tmp_path / "data",
        SONALITY_MESSAGE_RETENTION_DAYS=30,
        SONALITY_AUDIT_RETENTION_DAYS=MAX_DAYS,
        SONALITY_DELETE_AFTER_REMOVAL_DAYS=MAX_DAYS,
        SONALITY_BUFFER_TTL_MINUTES=MAX_MINUTES,
        SONALITY_IDLE_REFLECT_MINUTES=MAX_MINUTES,
    )
    async with open_runtime(settings, llm=llm) as runtime:
        reply = await say(runtime, "remember my tea")
        assert reply is not None and "went wrong" not in reply.text.lower(), reply
        second = await say(runtime, "and my biscuits")  # the buffer's cutoff is computed
        assert second is not None and "went wrong" not in second.text.lower(), second
        now = datetime.now(UTC)
        scheduler = ReflectionScheduler(runtime, clock=lambda: now)
        await scheduler.run_housekeeping(now + timedelta(days=31))
        assert stored_messages(settings.resolved_database_path) == [("", ""), ("", "")]
