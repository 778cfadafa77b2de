"""A reply whose message is deleted, or whose member runs forget-me, while it is being
written is paid for all the same. Its usage must reach the database, or `/sonality
usage`, a restart and the other processes on a shared database miss it, and a member who
deletes every message while it is answered spends past the daily limit."""

from __future__ import annotations

from typing import Any

import pytest

from bot.budget import BudgetLedger
from bot.messages import IncomingMessage
from bot.runtime import Runtime
from tests.integration.conftest import ALICE, A, command


async def ask_and_take_back(runtime: Runtime, ref: str, take_back: Any) -> None:
    """Alice's message `ref`, taken back (`take_back()`) while its reply streams."""
    done: list[bool] = []

    async def sink(piece: str) -> None:
        if not done:
            done.append(True)
            await take_back()

    message = IncomingMessage(
        community=A, channel_id="c1", user=ALICE, text="A long argument " * 50, message_id=ref
    )
    reply = await runtime.handle(message, on_text=sink)
    assert reply is not None and reply.text and done


async def test_a_reply_taken_back_while_written_is_still_counted(runtime: Runtime) -> None:
    await ask_and_take_back(runtime, "m1", lambda: runtime.message_deleted("test", "m1", A.id))

    async def forget() -> None:
        assert (await command(runtime, "forget-me", "confirm", moderator=False)).ok

    await ask_and_take_back(runtime, "m2", forget)
    await runtime.drain()
    assert await runtime.db.member_interaction_ids(A.id, ALICE.id) == []  # nothing of hers

    live = await runtime.budget.status(A.id)
    assert live.usage.input_tokens > 0
    restarted = await BudgetLedger.from_settings(runtime.db, runtime.settings).status(A.id)
    assert restarted.usage.input_tokens == live.usage.input_tokens
    assert restarted.spent_usd == pytest.approx(live.spent_usd)
