"""A member's share of the community's daily limit (bot/budget.py), end to end.

Prices as in test_budget: the reply model costs $1 per output token, so a message
containing "costN" costs $N; the evidence model is free unless a test prices it. The
limit is $10 and the share the default half, so a member is stopped at $5.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, date, datetime
from pathlib import Path
from typing import Any

import pytest

from adapters.discord import DiscordAdapter
from app.wiring import open_runtime
from bot import budget
from bot.messages import BUDGET_REACHED, SHARE_REACHED, Community, IncomingMessage, ReplyKind
from bot.runtime import Runtime
from sonality.llm import Usage
from tests.fakes.anthropic_server import AnthropicFake
from tests.fakes.discord_fixtures import (
    MANAGE_GUILD,
    is_ephemeral,
    restores_discord_endpoints,  # noqa: F401
)
from tests.fakes.discord_server import FakeDiscord, FakeGuild, FakeUser, RecordedRequest
from tests.integration.conftest import (
    ALICE,
    BOB,
    A,
    chat_requests,
    command,
    ess_requests,
    make_settings,
    say,
)
from tests.integration.discord_guild import guild_bot
from tests.integration.test_budget import (
    EVIDENCE_MODEL,
    PRICES,
    REPLY_MODEL,
    kind,
    price_replies,
    send,
)
from tests.integration.test_discord_e2e import settle
from tests.integration.test_isolation_and_commands import CANARY, CANARY_TEXT
from tests.pg import PostgresServer

WAIT = 10.0
LIMIT = {"SONALITY_DAILY_BUDGET_USD": 10}


def priced(data: Path, **overrides: Any) -> Any:
    values: dict[str, Any] = {
        "SONALITY_MODEL": REPLY_MODEL,
        "SONALITY_ESS_MODEL": EVIDENCE_MODEL,
        "SONALITY_PRICES": PRICES,
        **overrides,
    }
    return make_settings(data, **values)


# --------------------------------------------------------------------------- Discord


@dataclass
class Guild:
    fake: FakeDiscord
    runtime: Runtime
    adapter: DiscordAdapter
    guild: FakeGuild
    alice: FakeUser
    bob: FakeUser
    mod: FakeUser

    async def post(self, author: FakeUser, text: str) -> dict[str, Any]:
        return await self.fake.message_create(
            channel=self.guild.channels[0],
            author=author,
            content=f"<@{self.fake.bot.id}> {text}",
            mentions=[self.fake.bot],
        )

    def replies_to(self, trigger: dict[str, Any]) -> list[RecordedRequest]:
        return [
            r
            for r in self.fake.requests
            if r.method == "POST"
            and r.path == f"/channels/{trigger['channel_id']}/messages"
            and str(((r.json or {}).get("message_reference") or {}).get("message_id"))
            == trigger["id"]
        ]

    async def answered(self, author: FakeUser, text: str) -> str:
        """Post, wait for the one reply, return its text."""
        trigger = await self.post(author, text)
        await self.fake.wait_for(lambda r: r in self.replies_to(trigger), seconds=WAIT)
        [post] = self.replies_to(trigger)
        return str(post.json["content"])

    async def usage(self, user: FakeUser, permissions: int) -> str:
        iid, token = await self.fake.interaction_create(
            guild=self.guild,
            channel=self.guild.channels[0],
            user=user,
            subcommand="usage",
            permissions=permissions,
        )
        original = f"/webhooks/{self.fake.application_id}/{token}/messages/@original"
        [patch] = await self.fake.wait_for(
            lambda r: r.method == "PATCH" and r.path == original, seconds=WAIT
        )
        [callback] = self.fake.find("POST", f"/interactions/{iid}/{token}/callback")
        assert not is_ephemeral(callback)
        return str(patch.json["content"])


@pytest.fixture
async def guild(tmp_path: Path, llm: Any, anthropic_server: AnthropicFake) -> AsyncIterator[Guild]:
    price_replies(anthropic_server, 1, 3)
    alice, bob = FakeUser(9001, "alice", "Alice"), FakeUser(9003, "bob", "Bob")
    mod = FakeUser(9002, "mod", "Mo")
    priced_settings = {
        "SONALITY_MODEL": REPLY_MODEL,
        "SONALITY_ESS_MODEL": EVIDENCE_MODEL,
        "SONALITY_PRICES": PRICES,
        **LIMIT,
    }
    async with guild_bot(tmp_path / "data", llm, [alice, bob, mod], **priced_settings) as bot:
        yield Guild(bot.fake, bot.runtime, bot.adapter, bot.guild, alice, bob, mod)
        await command(bot.runtime, "budget", "off", community=_community(bot.guild))
        await asyncio.wait_for(bot.runtime.drain(), WAIT)


def _community(place: FakeGuild) -> Community:
    return Community(id=f"discord:{place.id}", name=place.name)


async def test_a_member_is_stopped_at_half_the_limit_told_once_and_the_others_answered(
    guild: Guild, anthropic_server: AnthropicFake
) -> None:
    g = guild
    assert SHARE_REACHED not in await g.answered(g.alice, "cost3 first")  # $3
    assert SHARE_REACHED not in await g.answered(g.alice, "cost3 second")  # $6 of her $5
    replies_asked = len(chat_requests(anthropic_server))
    assert await g.answered(g.alice, "cost1 third") == SHARE_REACHED
    # Her next message gets nothing at all: posted before Bob's, handled before his.
    silent = await g.post(g.alice, "cost1 fourth")
    assert SHARE_REACHED not in await g.answered(g.bob, "cost1 hello from Bob")
    await settle(g)  # type: ignore[arg-type]
    assert g.replies_to(silent) == []
    # The model answered Bob only: nothing was asked for Alice's third and fourth.
    assert len(chat_requests(anthropic_server)) == replies_asked + 1
    told = [
        r
        for r in g.fake.requests
        if r.method == "POST"
        and isinstance(r.json, dict)
        and r.json.get("content") == SHARE_REACHED
    ]
    assert len(told) == 1
    community = _community(g.guild)
    spent = await g.runtime.budget.member_spent(community.id)
    assert spent[str(g.alice.id)] == 6.0 and spent[str(g.bob.id)] == 1.0

    # Moderators see everyone's share by name, at chat width; Alice only her own.
    shown = await g.usage(g.mod, MANAGE_GUILD)
    body = shown.split("\n", 1)[1]  # after the **Usage** heading
    assert all(len(line) <= 60 for line in body.splitlines()), body
    assert "Member share: up to $5.00 each (50% of the limit)" in shown
    [alice_line] = [line for line in shown.splitlines() if "Alice" in line]
    assert "$6.00" in alice_line and "60%" in alice_line and "stopped" in alice_line
    [bob_line] = [line for line in shown.splitlines() if "Bob" in line]
    assert "$1.00" in bob_line and "stopped" not in bob_line
    assert str(g.alice.id) not in shown and str(g.bob.id) not in shown  # names, not ids
    own = await g.usage(g.alice, 0)
    assert "Your messages today: $6.00 (60% of the daily limit)" in own
    assert "Bob" not in own and "$1.00" not in own.split("Member share")[1]


# --------------------------------------------------------------------------- runtime


async def test_a_members_share_counts_their_reply_ess_and_insight_and_not_reflection(
    tmp_path: Path, llm: Any, anthropic_server: AnthropicFake
) -> None:
    """Every model is priced here, so the learning calls cost something."""
    anthropic_server.brain.ess_rule(**CANARY)  # an argument: ESS and an insight call
    every_token = {"input": 1_000_000, "output": 1_000_000, "cache_write": 0, "cache_read": 0}
    prices = {REPLY_MODEL: every_token, EVIDENCE_MODEL: every_token}
    async with open_runtime(priced(tmp_path / "data", SONALITY_PRICES=prices), llm=llm) as rt:
        await say(rt, CANARY_TEXT)
        assert len(ess_requests(anthropic_server)) == 1
        # The reply, the ESS call and the insight call, nothing else.
        assert len(chat_requests(anthropic_server)) == 1
        assert len(anthropic_server.requests) == 3
        status = await rt.budget.status(A.id)
        rows = await rt.db.usage_days(A.id, rt.budget.today(), rt.budget.today())
        assert {r.role for r in rows} == {"reply", "evidence"}
        # Alice alone spoke: every call so far was for her message.
        assert (await rt.budget.member_spent(A.id)) == {ALICE.id: pytest.approx(status.spent_usd)}
        assert status.spent_usd > (await _reply_cost(rt))  # the learning calls count too

        before = status.spent_usd
        reflected = await command(rt, "reflect")
        assert reflected.ok, reflected.text
        after = (await rt.budget.status(A.id)).spent_usd
        assert after > before  # reflection cost the community...
        spent = await rt.budget.member_spent(A.id)
        assert spent == {ALICE.id: pytest.approx(before)}  # ...and no member
        usage = await command(rt, "usage")
        assert budget.SHARED in usage.text

        await say(rt, "hello from Bob", user=BOB)
        spent = await rt.budget.member_spent(A.id)
        assert spent[BOB.id] > 0 and spent[ALICE.id] == pytest.approx(before)
        await rt.budget.flush()
        stored = await rt.db.member_spend(A.id, rt.budget.today())
        assert {s.member_id: s.usd for s in stored} == pytest.approx(spent)


async def _reply_cost(rt: Runtime) -> float:
    rows = await rt.db.usage_days(A.id, rt.budget.today(), rt.budget.today())
    return sum(
        budget.cost_usd(r.model, r.usage, rt.budget.prices) for r in rows if r.role == "reply"
    )


async def test_a_restart_keeps_the_shares_and_does_not_tell_the_member_again(
    tmp_path: Path, llm: Any, anthropic_server: AnthropicFake
) -> None:
    price_replies(anthropic_server, 1, 6)
    settings = priced(tmp_path / "data", **LIMIT)
    async with open_runtime(settings, llm=llm) as rt:
        assert kind(await send(rt, "cost6 a long one")) is ReplyKind.ANSWER
        reply = await send(rt, "cost1 again")
        assert reply is not None and reply.text == SHARE_REACHED
        await command(rt, "budget", "default")  # learning held back goes on; same limit
        await asyncio.wait_for(rt.drain(), WAIT)
    asked = len(chat_requests(anthropic_server))
    async with open_runtime(settings, llm=llm) as rt:
        assert (await rt.budget.member_spent(A.id))[ALICE.id] == 6.0
        assert await send(rt, "cost1 after the restart") is None  # stopped, told already
        assert kind(await send(rt, "cost1 I am Bob", user=BOB)) is ReplyKind.ANSWER
        assert len(chat_requests(anthropic_server)) == asked + 1
        await asyncio.wait_for(rt.drain(), WAIT)


async def test_the_operators_terminal_is_counted_but_never_stopped(
    tmp_path: Path, llm: Any, anthropic_server: AnthropicFake
) -> None:
    price_replies(anthropic_server, 6)
    async with open_runtime(priced(tmp_path / "data", **LIMIT), llm=llm) as rt:
        replies = [
            await rt.handle(
                IncomingMessage(community=A, channel_id="t", user=ALICE, text=text, trusted=True)
            )
            for text in ("cost6 one", "cost6 two", "cost6 three")
        ]
        # Past her share at $6 and still answered; the community's limit holds at $12.
        assert [kind(r) for r in replies] == [ReplyKind.ANSWER] * 2 + [ReplyKind.NOTICE]
        assert replies[2] is not None and replies[2].text == BUDGET_REACHED
        assert (await rt.budget.member_spent(A.id))[ALICE.id] == 12.0
        await command(rt, "budget", "off")
        await asyncio.wait_for(rt.drain(), WAIT)


async def test_forget_me_erases_the_members_stored_spend(
    tmp_path: Path, llm: Any, anthropic_server: AnthropicFake
) -> None:
    price_replies(anthropic_server, 1)
    async with open_runtime(priced(tmp_path / "data", **LIMIT), llm=llm) as rt:
        await say(rt, "cost1 hello")
        await say(rt, "cost1 hello from Bob", user=BOB)
        await rt.budget.flush()
        today = rt.budget.today()
        assert {s.member_id for s in await rt.db.member_spend(A.id, today)} == {ALICE.id, BOB.id}
        done = await command(rt, "forget-me", "confirm", moderator=False)
        assert done.ok, done.text
        assert [s.member_id for s in await rt.db.member_spend(A.id, today)] == [BOB.id]
        assert (await rt.db.member_rows(A.id, ALICE.id)).spend == ()


async def test_a_forgotten_members_spend_leaves_the_usage_list_and_stays_the_communitys(
    tmp_path: Path, llm: Any, anthropic_server: AnthropicFake
) -> None:
    """Forget-me and forget-user take the member's figure out of the ledger too (not
    only out of the database): moderators' `usage` no longer lists them, by name or as
    a nameless member, and what they spent stays in the community's day, nobody's."""
    price_replies(anthropic_server, 3, 1)
    async with open_runtime(priced(tmp_path / "data", **LIMIT), llm=llm) as rt:
        await say(rt, "cost3 hello")
        await say(rt, "cost1 hello from Bob", user=BOB)
        await rt.budget.flush()
        total = (await rt.budget.status(A.id)).spent_usd
        assert total == 4.0
        before_forget = datetime.now(UTC)

        done = await command(rt, "forget-me", "confirm", moderator=False)
        assert done.ok, done.text
        assert await rt.budget.member_spent(A.id) == {BOB.id: 1.0}
        shown = (await command(rt, "usage", user=BOB)).text
        assert "Alice" not in shown and budget.UNNAMED not in shown, shown
        [bob_line] = [line for line in shown.splitlines() if "Bob" in line]
        assert "$1.00" in bob_line
        [shared] = [line for line in shown.splitlines() if budget.SHARED in line]
        assert "$3.00" in shared  # hers, nobody's now
        assert (await rt.budget.status(A.id)).spent_usd == total  # the money was spent

        # A call for a message of hers from before the forget (a reply in flight) is
        # the community's only; one for a message she sends after it is hers again.
        await rt.budget.record(
            A.id, REPLY_MODEL, Usage(output_tokens=2), ALICE.id, since=before_forget
        )
        assert ALICE.id not in await rt.budget.member_spent(A.id)
        await say(rt, "cost1 I am back")
        assert (await rt.budget.member_spent(A.id))[ALICE.id] == 1.0

        forgot = await command(rt, "forget-user", BOB.id, "asked by email", user=ALICE)
        assert forgot.ok, forgot.text
        assert BOB.id not in await rt.budget.member_spent(A.id)
        assert "Bob" not in (await command(rt, "usage", user=ALICE)).text
        assert (await rt.budget.status(A.id)).spent_usd == total + 3.0
        await asyncio.wait_for(rt.drain(), WAIT)


def test_a_member_without_a_stored_name_reads_whole_in_usage() -> None:
    status = budget.BudgetStatus(
        day=date(2026, 3, 10),
        spent_usd=9.0,
        usage=Usage(),
        limit=budget.SpendLimit(usd=10.0, source="default"),
    )
    lines = budget.member_share_lines(
        {"u-1": 6.0, "u-2": 1.0}, {"u-2": "Bob"}, status, share_usd=5.0
    )
    [nameless] = [line for line in lines if "$6.00" in line]
    assert "a member (no name stored)" in nameless and "stopped" in nameless
    assert any(budget.SHARED in line and "$2.00" in line for line in lines)
    assert all(len(line) <= 60 for line in lines), lines


# --------------------------------------------------------------------------- PostgreSQL


async def test_two_processes_tell_a_member_once_and_stop_them_both(
    tmp_path: Path,
    postgres_server: PostgresServer,
    anthropic_server: AnthropicFake,
    llm: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Two runtimes on one PostgreSQL database, as two processes behind a load balancer:
    Alice's spend through one stops her in the other, and she is told once."""
    monkeypatch.setattr(budget, "SHARED_SYNC_SECONDS", 0.0)  # take in stored spend at once
    price_replies(anthropic_server, 1, 6)
    url = postgres_server.new_database()
    shared = {"DATABASE_URL": url, **LIMIT}
    try:
        async with (
            open_runtime(priced(tmp_path / "a", **shared), llm=llm) as one,
            open_runtime(priced(tmp_path / "b", **shared), llm=llm) as two,
        ):
            assert kind(await send(two, "cost1 hello")) is ReplyKind.ANSWER  # two knows A
            assert kind(await send(one, "cost6 a long one")) is ReplyKind.ANSWER  # $7
            await one.budget.flush()
            replies = [await send(rt, "cost1 more?") for rt in (two, one, two, one)]
            assert [r.text if r else None for r in replies] == [SHARE_REACHED, None, None, None]
            assert kind(await send(one, "cost1 I am Bob", user=BOB)) is ReplyKind.ANSWER
            assert kind(await send(two, "cost1 Bob again", user=BOB)) is ReplyKind.ANSWER
            for rt in (one, two):
                await command(rt, "budget", "off")
                await asyncio.wait_for(rt.drain(), WAIT)
    finally:
        postgres_server.drop(url)


async def test_a_member_forgotten_in_one_process_leaves_the_others_ledger(
    tmp_path: Path,
    postgres_server: PostgresServer,
    anthropic_server: AnthropicFake,
    llm: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Two runtimes on one PostgreSQL database: Alice's spend through one is taken in by
    the other; her forget-me through the first drops her figure from the second at its
    next sync, and the community's spend stays in both."""
    monkeypatch.setattr(budget, "SHARED_SYNC_SECONDS", 0.0)  # take in stored spend at once
    price_replies(anthropic_server, 3, 1)
    url = postgres_server.new_database()
    shared = {"DATABASE_URL": url, **LIMIT}
    try:
        async with (
            open_runtime(priced(tmp_path / "a", **shared), llm=llm) as one,
            open_runtime(priced(tmp_path / "b", **shared), llm=llm) as two,
        ):
            assert kind(await send(two, "cost1 I am Bob", user=BOB)) is ReplyKind.ANSWER
            assert kind(await send(one, "cost3 hello")) is ReplyKind.ANSWER
            await one.budget.flush()
            await two.budget.flush()
            assert await two.budget.member_spent(A.id) == {ALICE.id: 3.0, BOB.id: 1.0}
            for rt in (one, two):
                await asyncio.wait_for(rt.drain(), WAIT)
            totals = [(await rt.budget.status(A.id)).spent_usd for rt in (one, two)]

            done = await command(one, "forget-me", "confirm", moderator=False)
            assert done.ok, done.text
            for rt in (one, two):
                assert await rt.budget.member_spent(A.id) == {BOB.id: 1.0}
                assert "Alice" not in (await command(rt, "usage", user=BOB)).text
            assert [(await rt.budget.status(A.id)).spent_usd for rt in (one, two)] == totals
    finally:
        postgres_server.drop(url)
