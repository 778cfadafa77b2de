"""Several processes on one database: a community's learning lease is let go while
learning waits (the model down, the daily limit reached: until midnight) and, on a
long outbox, every `LEASE_TURN_SECONDS`, so a forget-me in another process, which waits
two minutes at most for the lease (`LEASE_WAIT_SECONDS`), gets it."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from bot.messages import IncomingMessage, ReplyKind
from sonality import agent as agent_module
from sonality import learning
from tests.chroma_server import ChromaServer, chroma_server  # noqa: F401 (fixture)
from tests.fakes.anthropic_server import AnthropicFake
from tests.integration.conftest import BOB, A, command, eventually, say
from tests.integration.test_budget import (
    EVIDENCE_MODEL,
    PRICES,
    REPLY_MODEL,
    kind,
    price_replies,
    send,
)
from tests.integration.test_multi_process import two_runtimes
from tests.pg import PostgresServer

PRICED = {
    "SONALITY_MODEL": REPLY_MODEL,
    "SONALITY_ESS_MODEL": EVIDENCE_MODEL,
    "SONALITY_PRICES": PRICES,
    "SONALITY_DAILY_BUDGET_USD": 5,
    "SONALITY_MEMBER_BUDGET_SHARE": 1,
}


@pytest.fixture(autouse=True)
def short_waits(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(agent_module, "LEASE_WAIT_SECONDS", 10.0)  # production: 120
    monkeypatch.setattr(learning, "LEASE_TURN_SECONDS", 1.0)


async def test_a_forget_me_elsewhere_goes_through_while_learning_waits_for_midnight(
    tmp_path: Path,
    postgres_server: PostgresServer,
    chroma_server: ChromaServer,  # noqa: F811
    anthropic_server: AnthropicFake,
    llm: Any,
) -> None:
    price_replies(anthropic_server, 1, 6)
    async with two_runtimes(tmp_path, postgres_server, chroma_server, llm, **PRICED) as (
        one,
        two,
    ):
        assert kind(await send(one, "cost1 the quokkaharbor study says so")) is ReplyKind.ANSWER
        await asyncio.wait_for(one.drain(), 20)
        assert kind(await send(one, "cost6 and another thing")) is ReplyKind.ANSWER  # $7 of $5
        agent = await one.registry.agent_for(A)
        assert await eventually(lambda: agent.learning_held, 10)  # refused until midnight

        done = await command(two, "forget-me", "confirm", moderator=False)
        assert done.ok and "Forgotten" in done.text, done.text
        assert await two.db.open_forgets() == []
        await command(one, "budget", "off")
        await asyncio.wait_for(one.drain(), 20)


async def test_a_forget_me_elsewhere_goes_through_while_a_long_outbox_is_learned(
    tmp_path: Path,
    postgres_server: PostgresServer,
    chroma_server: ChromaServer,  # noqa: F811
    anthropic_server: AnthropicFake,
    llm: Any,
) -> None:
    async with two_runtimes(tmp_path, postgres_server, chroma_server, llm) as (one, two):
        await say(one, "Hello, the quokkaharbor study says remote work helps.", community=A)
        anthropic_server.latency = 0.25  # each call: the outbox never empties below
        stop = asyncio.Event()

        async def chatter() -> None:
            n = 0
            while not stop.is_set():
                text = f"message {n} from bob"
                await one.handle(IncomingMessage(community=A, channel_id="c1", user=BOB, text=text))
                n += 1

        talking = asyncio.create_task(chatter())
        await asyncio.sleep(2)
        try:
            done = await command(two, "forget-me", "confirm", moderator=False)
        finally:
            stop.set()
            await talking
            anthropic_server.latency = 0
        assert done.ok and "Forgotten" in done.text, done.text
        await asyncio.wait_for(one.drain(), 60)
