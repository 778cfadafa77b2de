"""Daily spending limits, end to end: the real runtime, SDK and storage, a fake LLM
server whose reply lengths set each message's price, and a clock the tests move.

Prices: the reply model costs $1 per output token and nothing else; the evidence
model (ESS, insight, reflection) is free. A reply rule makes the answer to a message
containing "costN" exactly N tokens long, so that message costs $N.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from app.wiring import open_runtime
from bot import budget
from bot.budget import BudgetExceeded, BudgetLedger, MeteredLLM
from bot.messages import BUDGET_REACHED, IncomingMessage, Reply, ReplyKind, User
from bot.runtime import Runtime
from bot.scheduler import ReflectionScheduler
from providers.pricing import ModelPrice
from sonality.ess import ESS_TOOL
from sonality.llm import ChatTurn, LLMError, Usage
from storage import Database
from tests.fakes.anthropic_server import AnthropicFake
from tests.fakes.openai_fixtures import openai_client_for
from tests.fakes.openai_server import Fault, OpenAIFake, Text
from tests.integration.conftest import (
    ALICE,
    BOB,
    A,
    chat_requests,
    command,
    ess_requests,
    eventually,
    make_settings,
    say,
)
from tests.pg import PostgresServer

REPLY_MODEL = "claude-sonnet-4-6"
EVIDENCE_MODEL = "claude-haiku-4-5"
FREE = {"input": 0, "output": 0, "cache_write": 0, "cache_read": 0}
PRICES = {
    REPLY_MODEL: {"input": 0, "output": 1_000_000, "cache_write": 0, "cache_read": 0},
    EVIDENCE_MODEL: FREE,
}
CAROL = User(id="u-carol", name="Carol")
# 23:30 on 10 March in India (UTC+5:30, no daylight saving): midnight is 18:30 UTC.
NEAR_MIDNIGHT_IST = datetime(2026, 3, 10, 18, 0, tzinfo=UTC)


@dataclass
class Clock:
    now: datetime

    def __call__(self) -> datetime:
        return self.now


def price_replies(server: AnthropicFake, *costs: int) -> None:
    """A message containing "costN" gets a reply of N output tokens (4 characters each)."""
    for usd in sorted(costs, reverse=True):  # "cost10" before "cost1": first match wins
        server.brain.reply_rule(contains=f"cost{usd}", text="abcd" * usd)


@pytest.fixture
def clock() -> Clock:
    return Clock(datetime(2026, 3, 10, 12, 0, tzinfo=UTC))


@pytest.fixture
async def budgeted(
    tmp_path: Path, llm: Any, anthropic_server: AnthropicFake, clock: Clock
) -> AsyncIterator[Runtime]:
    """A runtime with a $5 default daily limit and the test's clock."""
    price_replies(anthropic_server, 1, 2, 3, 4, 6)
    async with open_runtime(settings_for(tmp_path, SONALITY_DAILY_BUDGET_USD=5), llm=llm) as rt:
        rt.budget.clock = clock
        yield rt
        await release(rt)


def settings_for(tmp_path: Path, **overrides: Any) -> Any:
    """These tests are about the community's limit, spent by one or two members: the
    member share (tests/integration/test_member_share.py) is off unless asked for."""
    values: dict[str, Any] = {"SONALITY_MEMBER_BUDGET_SHARE": 1, **overrides}
    return make_settings(
        tmp_path / "data",
        SONALITY_MODEL=REPLY_MODEL,
        SONALITY_ESS_MODEL=EVIDENCE_MODEL,
        SONALITY_PRICES=PRICES,
        **values,
    )


async def send(rt: Runtime, text: str, user: User = ALICE) -> Reply | None:
    """One message, without waiting for its learning (which the limit may hold back)."""
    return await rt.handle(IncomingMessage(community=A, channel_id="c1", user=user, text=text))


def kind(reply: Reply | None) -> ReplyKind | None:
    return None if reply is None else reply.kind


async def release(rt: Runtime) -> None:
    """Lift the limit so learning held back by it finishes before the runtime closes."""
    await command(rt, "budget", "off")
    await asyncio.wait_for(rt.drain(), 10)


async def test_past_the_limit_each_member_is_told_once_and_nothing_reaches_the_model(
    budgeted: Runtime, anthropic_server: AnthropicFake
) -> None:
    first = await send(budgeted, "cost6 hello")  # $6 of $5: answered, then over
    assert first is not None and first.kind is ReplyKind.ANSWER
    calls = len(anthropic_server.requests)
    assert calls == 1  # learning's ESS call was refused before it left

    told = await send(budgeted, "cost1 are you there?")
    assert told == Reply(text=BUDGET_REACHED, kind=ReplyKind.NOTICE)
    assert await send(budgeted, "cost1 hello??") is None
    assert await send(budgeted, "cost1 hi", user=BOB) == told  # Bob is told once too
    assert await send(budgeted, "cost1 still?", user=BOB) is None
    assert await send(budgeted, "cost1 me again") is None
    assert len(anthropic_server.requests) == calls
    assert len(chat_requests(anthropic_server)) == 1

    # Commands still work, and say why it is quiet.
    status = await command(budgeted, "status", moderator=False)
    assert status.ok
    assert "Today: " in status.text and "$6.00 (estimated)" in status.text
    assert "Daily limit: $5.00 a day (default)" in status.text
    assert "Limit reached" in status.text


async def test_the_day_starts_anew_at_local_midnight(
    tmp_path: Path, llm: Any, anthropic_server: AnthropicFake
) -> None:
    price_replies(anthropic_server, 1, 6)
    clock = Clock(NEAR_MIDNIGHT_IST)
    settings = settings_for(tmp_path, SONALITY_DAILY_BUDGET_USD=5, SONALITY_TIMEZONE="Asia/Kolkata")
    async with open_runtime(settings, llm=llm) as rt:
        rt.budget.clock = clock
        assert kind(await send(rt, "cost6 late question")) is ReplyKind.ANSWER
        with pytest.raises(BudgetExceeded) as refused:
            await rt.budget.check(A.id)
        assert refused.value.retry_after == 30 * 60  # until midnight in India, not UTC
        assert kind(await send(rt, "cost1 hello?")) is ReplyKind.NOTICE

        clock.now = NEAR_MIDNIGHT_IST + timedelta(minutes=29, seconds=59)  # 23:59:59 there
        assert await send(rt, "cost1 still there?") is None
        clock.now = NEAR_MIDNIGHT_IST + timedelta(minutes=30)  # 00:00 on 11 March there
        morning = await send(rt, "cost1 good morning")
        assert morning is not None and morning.kind is ReplyKind.ANSWER
        assert len(chat_requests(anthropic_server)) == 2
        status = await rt.budget.status(A.id)
        assert (str(status.day), status.spent_usd) == ("2026-03-11", 1.0)
        await release(rt)


async def test_a_moderator_raises_the_limit_turns_it_off_or_back_to_the_default(
    budgeted: Runtime, anthropic_server: AnthropicFake
) -> None:
    await send(budgeted, "cost6 hello")
    assert kind(await send(budgeted, "cost1 hi")) is ReplyKind.NOTICE

    raised = await command(budgeted, "budget", "$10")
    assert raised.ok, raised.text
    assert "Daily limit: $10.00 a day (set for this community)" in raised.text
    await asyncio.wait_for(budgeted.drain(), 10)  # held learning goes on at once
    answered = await send(budgeted, "cost3 back again")
    assert answered is not None and answered.kind is ReplyKind.ANSWER
    await asyncio.wait_for(budgeted.drain(), 10)

    off = await command(budgeted, "budget", "off")
    assert "no limit (turned off by a moderator)" in off.text
    assert kind(await send(budgeted, "cost4 and more")) is ReplyKind.ANSWER  # $13: no limit
    await asyncio.wait_for(budgeted.drain(), 10)

    default = await command(budgeted, "budget", "default")
    assert "Daily limit: $5.00 a day (default)" in default.text
    # A new limit gives everyone their one notice again.
    assert kind(await send(budgeted, "cost1 hi")) is ReplyKind.NOTICE
    assert await send(budgeted, "cost1 hi") is None
    override = await budgeted.db.budget_override(A.id)
    assert override is None

    for bad in ("lots", "-3", "nan", "1e308", "100000.01"):
        refused = await command(budgeted, "budget", bad)
        assert not refused.ok and refused.private, bad
        assert len(refused.text) < 120, refused.text
    assert (await command(budgeted, "budget", "100000")).ok


async def test_a_member_may_look_at_the_budget_but_not_change_it(
    budgeted: Runtime, anthropic_server: AnthropicFake
) -> None:
    await send(budgeted, "cost6 hello")
    refused = await command(budgeted, "budget", "100", user=BOB, moderator=False)
    assert not refused.ok and "Only moderators" in refused.text
    look = await command(budgeted, "budget", user=BOB, moderator=False)
    assert look.ok and "$6.00" in look.text and "$5.00 a day (default)" in look.text
    [action] = await budgeted.db.moderator_actions(A.id)  # the look is not a moderator action
    assert (action.action, action.args, action.allowed) == ("budget", "100", False)
    assert await budgeted.db.budget_override(A.id) is None
    assert kind(await send(budgeted, "cost1 hi", user=BOB)) is ReplyKind.NOTICE


async def test_learning_held_by_the_limit_is_applied_after_midnight(
    tmp_path: Path, llm: Any, anthropic_server: AnthropicFake
) -> None:
    """The message that spent the last of the budget was answered; its ESS call was
    refused, so its learning waits (in the outbox, in order) and lands after the
    community's local midnight, when the scheduler wakes it."""
    anthropic_server.brain.ess_rule(
        contains="randomised trial",
        score=0.7,
        direction="supports",
        topics=["tutoring"],
        novelty=0.8,
    )
    price_replies(anthropic_server, 6)
    clock = Clock(NEAR_MIDNIGHT_IST)
    settings = settings_for(tmp_path, SONALITY_DAILY_BUDGET_USD=5, SONALITY_TIMEZONE="Asia/Kolkata")
    async with open_runtime(settings, llm=llm) as rt:
        rt.budget.clock = clock
        text = "cost6 A randomised trial showed tutoring lifts maths scores."
        assert kind(await send(rt, text)) is ReplyKind.ANSWER
        agent = rt.registry.get(A.id)
        assert agent is not None
        assert await eventually(lambda: rt.budget.refused_today(A.id) >= 1, 5)
        assert ess_requests(anthropic_server) == []
        assert await rt.db.community(A.id).pending_count() == 1  # kept, not dropped
        assert agent.sponge.interaction_count == 0

        clock.now = NEAR_MIDNIGHT_IST + timedelta(minutes=31)  # 00:01 in India
        await ReflectionScheduler(rt, clock=clock).run_housekeeping()
        await asyncio.wait_for(rt.drain(), 10)
        assert await rt.db.community(A.id).pending_count() == 0
        [ess] = await rt.db.community(A.id).audit_events(kind="ess")
        assert ess.payload["score"] == 0.7 and not ess.payload["used_defaults"]
        assert [u.topic for u in agent.sponge.staged_opinion_updates] == ["tutoring"]
        assert len(ess_requests(anthropic_server)) == 1


async def test_the_80_percent_warning_is_logged_once_and_shown_in_status(
    tmp_path: Path,
    llm: Any,
    anthropic_server: AnthropicFake,
    clock: Clock,
    caplog: pytest.LogCaptureFixture,
) -> None:
    price_replies(anthropic_server, 1, 4, 5)
    caplog.set_level(logging.WARNING, logger="bot.budget")
    async with open_runtime(settings_for(tmp_path, SONALITY_DAILY_BUDGET_USD=10), llm=llm) as rt:
        rt.budget.clock = clock
        await say(rt, "cost5 hello")  # 50%
        assert not _warnings(caplog)
        assert "Warning" not in (await command(rt, "status")).text
        await say(rt, "cost4 more")  # 90%
        [record] = _warnings(caplog)
        assert A.id in record.getMessage()
        assert "$9.00" in record.getMessage() and "$10.00" in record.getMessage()
        await say(rt, "cost1 and more", user=CAROL)  # 100%: no second warning
        assert len(_warnings(caplog)) == 1
        status = await command(rt, "status")
        assert "Limit reached" in status.text
        await release(rt)
    caplog.clear()


async def test_status_shows_the_warning_line_between_80_and_100_percent(
    budgeted: Runtime, anthropic_server: AnthropicFake
) -> None:
    await say(budgeted, "cost4 hello")  # $4 of $5
    status = await command(budgeted, "status", moderator=False)
    assert "Warning: 80% of today's limit is spent" in status.text
    assert "Limit reached" not in status.text


def _warnings(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [
        r
        for r in caplog.records
        if r.name == "bot.budget" and r.levelno == logging.WARNING and "daily limit" in r.message
    ]


async def test_today_s_spend_survives_a_restart(
    tmp_path: Path, llm: Any, anthropic_server: AnthropicFake
) -> None:
    """The ledger starts from the database's figure for today (real clock here: the
    stored usage carries the real time)."""
    price_replies(anthropic_server, 3)
    settings = settings_for(tmp_path, SONALITY_DAILY_BUDGET_USD=5)
    async with open_runtime(settings, llm=llm) as rt:
        await say(rt, "cost3 hello")
    async with open_runtime(settings, llm=llm) as rt:
        assert (await rt.budget.status(A.id)).spent_usd == 3.0
        assert kind(await send(rt, "cost3 again")) is ReplyKind.ANSWER  # $6 now
        assert kind(await send(rt, "cost3 and again")) is ReplyKind.NOTICE
        await release(rt)


async def test_usage_lists_roles_days_and_month_in_tokens_and_dollars(
    tmp_path: Path, llm: Any, anthropic_server: AnthropicFake
) -> None:
    price_replies(anthropic_server, 2, 3)
    async with open_runtime(settings_for(tmp_path), llm=llm) as rt:
        await say(rt, "cost2 hello")
        await say(rt, "cost3 there")
        result = await command(rt, "usage", "3", moderator=False)
        assert result.ok
        lines = result.text.splitlines()
        assert all(len(line) <= 60 for line in lines), result.text
        assert lines[0] == "Estimated cost in USD; days end at midnight UTC."
        today = next(line for line in lines if line.startswith("Today ("))
        assert today.endswith("$5.00")
        reply, evidence, reflection = lines[lines.index(today) + 1 : lines.index(today) + 4]
        assert reply.split()[0] == "reply" and reply.endswith("$5.00")
        assert evidence.split()[0] == "evidence" and evidence.endswith("$0")
        assert evidence.split()[1] != "0"  # ESS tokens were spent, at no cost
        assert reflection.split()[:2] == ["reflection", "0"]
        header = lines.index("Last 3 days:")
        days = lines[header + 2 : header + 5]
        assert len(days) == 3 and "$5.00" in days[0] and days[1].endswith("$0")
        assert any(line.startswith("This month (") and line.endswith("$5.00") for line in lines)
        assert "Daily limit: no limit" in lines

        default = await command(rt, "usage", moderator=False)
        assert "Last 7 days:" in default.text
        for bad in ("0", "91", "week"):
            refused = await command(rt, "usage", bad, moderator=False)
            assert not refused.ok and refused.private, bad


async def test_reflection_waits_while_the_limit_is_reached(
    budgeted: Runtime, anthropic_server: AnthropicFake, clock: Clock
) -> None:
    """Reflection would first wait for the learning the limit holds back, so neither
    the nightly job nor a moderator's reflect starts one; both say why instead."""
    await send(budgeted, "cost6 hello")
    calls = len(anthropic_server.requests)
    reflect = await command(budgeted, "reflect")
    assert not reflect.ok and "spending limit" in reflect.text
    scheduler = ReflectionScheduler(budgeted, clock=clock)
    assert await scheduler.run_nightly(clock.now + timedelta(hours=1)) == []
    assert len(anthropic_server.requests) == calls


async def test_a_refused_call_waits_until_local_midnight_even_on_a_daylight_saving_day(
    tmp_path: Path, llm: Any, anthropic_server: AnthropicFake
) -> None:
    """Berlin moves its clocks forward on 29 March 2026: that day has 23 hours."""
    clock = Clock(datetime(2026, 3, 28, 23, 0, tzinfo=UTC))  # 00:00 on 29 March there
    settings = settings_for(
        tmp_path, SONALITY_DAILY_BUDGET_USD=0, SONALITY_TIMEZONE="Europe/Berlin"
    )
    async with open_runtime(settings, llm=llm) as rt:
        rt.budget.clock = clock
        with pytest.raises(BudgetExceeded) as refused:  # a $0 limit allows nothing
            await rt.budget.check(A.id)
        assert refused.value.retry_after == 23 * 3600
        assert kind(await send(rt, "cost1 hello")) is ReplyKind.NOTICE
        assert anthropic_server.requests == []


async def test_counting_a_call_waits_for_no_read_of_a_shared_database(
    postgres_server: PostgresServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Counting runs between a reply's model call and its sending, so with several
    processes on one PostgreSQL database it does not wait to take in their stored
    spend; the next check before a call still does."""
    monkeypatch.setattr(budget, "SHARED_SYNC_SECONDS", 0.0)  # a look is always due
    db = await Database.open_url(postgres_server.new_database())
    try:
        prices = {REPLY_MODEL: ModelPrice(input=0, output=1_000_000, cache_write=0, cache_read=0)}
        ledger = BudgetLedger(db, default_limit_usd=5, prices=prices)
        await ledger.check(A.id)  # today's figures and the limit, loaded
        reads: list[str] = []
        for name in ("usage_days", "budget_override"):
            original = getattr(db, name)

            async def counted(*args: Any, _original: Any = original, _name: str = name) -> Any:
                reads.append(_name)
                return await _original(*args)

            monkeypatch.setattr(db, name, counted)
        await ledger.record(A.id, REPLY_MODEL, Usage(output_tokens=2))
        assert reads == []
        assert (await ledger.status(A.id)).spent_usd == 2  # counted all the same
        await ledger.check(A.id)
        assert "usage_days" in reads
    finally:
        await db.close()


async def test_a_call_that_fails_after_an_answer_still_counts_the_answer(
    budgeted: Runtime, openai_server: OpenAIFake
) -> None:
    """An OpenAI-compatible model asked for JSON answered in prose (the client then
    tries the next way), and the server failed on that: the first answer was paid for,
    so the community's day counts it although the call as a whole failed."""
    client = openai_client_for(openai_server, max_retries=0)
    metered = MeteredLLM(client, budgeted.budget, A.id)
    before = await budgeted.budget.status(A.id)
    openai_server.enqueue(Text("I'd rather chat."), Fault(status=503))
    try:
        with pytest.raises(LLMError):
            await metered.call_tool(
                system=[],
                messages=[ChatTurn(role="user", content="<message>A survey.</message>")],
                tool=ESS_TOOL,
                max_tokens=100,
            )
    finally:
        await client.aclose()
    after = await budgeted.budget.status(A.id)
    served = openai_server.responses[0]["usage"]
    assert after.usage.output_tokens - before.usage.output_tokens == served["completion_tokens"]
    assert after.usage.input_tokens > before.usage.input_tokens
