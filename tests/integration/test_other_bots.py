"""Other bots, through the real runtime (SQLite and PostgreSQL): a listed bot is answered
at most SONALITY_BOT_EXCHANGES times in a row per channel, across a restart, until a
person writes there; an unlisted bot never; and nothing a bot says is learned."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from app.wiring import open_runtime
from bot.messages import LLM_DOWN, IncomingMessage, Reply, User
from bot.runtime import Runtime
from tests.fakes.anthropic_server import AnthropicFake, Fault
from tests.integration.conftest import (
    ALICE,
    A,
    chat_requests,
    ess_requests,
    make_settings,
    prompt_of,
)
from tests.integration.test_isolation_and_commands import CANARY, CANARY_TEXT
from tests.stack import on_every_stack

pytestmark = on_every_stack

HELPER = User(id="B0HELPER", name="Helper", is_bot=True)
STRANGER = User(id="B0STRANGER", name="Stranger", is_bot=True)


@contextlib.asynccontextmanager
async def bot_runtime(tmp_path: Path, llm: Any, **settings: Any) -> AsyncIterator[Runtime]:
    config = make_settings(
        tmp_path / "data", llm=llm, SONALITY_ANSWER_BOTS=f" {HELPER.id} ,", **settings
    )
    async with open_runtime(config, llm=llm) as runtime:
        yield runtime


async def send(
    runtime: Runtime, user: User, text: str, channel: str = "c1", *, addressed: bool = True
) -> Reply | None:
    reply = await runtime.handle(
        IncomingMessage(community=A, channel_id=channel, user=user, text=text, addressed=addressed)
    )
    await runtime.drain()
    return reply


async def test_a_listed_bot_is_answered_three_times_in_a_row_per_channel_until_a_person_writes(
    tmp_path: Path, llm: Any, anthropic_server: AnthropicFake
) -> None:
    async with bot_runtime(tmp_path, llm) as runtime:
        for i in range(3):
            reply = await send(runtime, HELPER, f"question {i}")
            assert reply is not None and reply.text == f"[reply] question {i}"
        calls = len(anthropic_server.requests)
        assert await send(runtime, HELPER, "question 3") is None
        assert len(anthropic_server.requests) == calls  # not even a model call
        # Another channel keeps its own count.
        assert await send(runtime, HELPER, "elsewhere", channel="c2") is not None
        calls = len(anthropic_server.requests)

    # A restart does not start the count again: the loop would run three more rounds.
    async with bot_runtime(tmp_path, llm) as runtime:
        assert await send(runtime, HELPER, "after the restart") is None
        assert len(anthropic_server.requests) == calls
        # A person writing in the channel, even to someone else, ends the bots' run.
        assert await send(runtime, ALICE, "morning all", addressed=False) is None
        assert len(anthropic_server.requests) == calls
        for i in range(3):
            assert await send(runtime, HELPER, f"again {i}") is not None
        assert await send(runtime, HELPER, "one too many") is None
        # ...and so does a person talking to the bot (answered as ever).
        assert await send(runtime, ALICE, "hello") is not None
        assert await send(runtime, HELPER, "and now?") is not None
        # A person in c2 leaves c1's count alone.
        await send(runtime, HELPER, "again 5")
        await send(runtime, HELPER, "again 6")
        await send(runtime, ALICE, "hi", channel="c2", addressed=False)
        calls = len(anthropic_server.requests)
        assert await send(runtime, HELPER, "c1 is full") is None
        assert len(anthropic_server.requests) == calls


async def test_an_unlisted_bot_is_never_answered_and_costs_nothing(
    tmp_path: Path, llm: Any, anthropic_server: AnthropicFake
) -> None:
    async with bot_runtime(tmp_path, llm) as runtime:
        assert await send(runtime, STRANGER, "hello?") is None
        assert anthropic_server.requests == []
        assert await runtime.db.bot_reply_counts() == {}
    async with open_runtime(make_settings(tmp_path / "other", llm=llm), llm=llm) as runtime:
        # The default: no bot at all, listed or not.
        assert await send(runtime, HELPER, "hello?") is None
        assert anthropic_server.requests == []


async def test_a_bots_strong_argument_is_answered_but_moves_nothing(
    tmp_path: Path, llm: Any, anthropic_server: AnthropicFake
) -> None:
    anthropic_server.brain.ess_rule(**CANARY)
    async with bot_runtime(tmp_path, llm) as runtime:
        await send(runtime, ALICE, "hello")  # the community exists, with one message
        agent = await runtime.registry.agent_for(A)
        store = runtime.db.community(A.id)
        before = agent.sponge.model_dump()
        evidence = await store.evidence()
        episodes = agent.episodes.count()

        for _ in range(3):
            reply = await send(runtime, HELPER, CANARY_TEXT)
            assert reply is not None and "road-safety audit" in reply.text
        # The model was told a bot wrote it...
        assert "Helper (a bot)" in prompt_of(chat_requests(anthropic_server)[-1])
        # ...and nothing of it was judged, learned, remembered or queued.
        assert ess_requests(anthropic_server) == [ess_requests(anthropic_server)[0]]
        assert agent.sponge.model_dump() == before
        assert (await runtime.registry.agent_for(A)).sponge.version == before["version"]
        assert await store.evidence() == evidence
        assert agent.episodes.count() == episodes
        assert await store.pending_interactions() == []
        assert not await runtime.db._fetchall(
            "SELECT id FROM interactions WHERE speaker_id = ?", [HELPER.id]
        )
        # What the replies cost is counted like any reply's.
        days = await runtime.db.usage_days(A.id)
        assert sum(d.calls for d in days if d.role == "reply") == 4

        # The same words from a person are judged and learned: the checks above can fail.
        await send(runtime, ALICE, CANARY_TEXT)
        assert len(ess_requests(anthropic_server)) == 2
        assert agent.sponge.version == before["version"] + 1
        assert "canary_zebra_crossings" in agent.sponge.behavioral_signature.topic_engagement


async def test_notices_are_for_people_not_for_bots(
    tmp_path: Path, llm: Any, anthropic_server: AnthropicFake
) -> None:
    async with bot_runtime(tmp_path, llm) as runtime:
        anthropic_server.enqueue(*[Fault(status=500, retry_after_ms=5)] * 3)
        assert await send(runtime, HELPER, "are you there?") is None
        assert anthropic_server.script_left == 0  # it was asked, and the model failed
        reply = await send(runtime, HELPER, "and now?")
        assert reply is not None and reply.text == "[reply] and now?"
        anthropic_server.enqueue(*[Fault(status=500, retry_after_ms=5)] * 3)
        reply = await send(runtime, ALICE, "are you there?")
        assert reply is not None and reply.text == LLM_DOWN


async def test_a_person_writing_while_a_bots_reply_is_counted_still_ends_the_run(
    tmp_path: Path, llm: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with bot_runtime(tmp_path, llm, SONALITY_BOT_EXCHANGES=1) as runtime:
        db = runtime.db
        claim = db.claim_bot_reply
        counted, go_on = asyncio.Event(), asyncio.Event()

        async def slow_claim(community_id: str, channel_id: str, limit: int) -> bool:
            taken = await claim(community_id, channel_id, limit)
            counted.set()
            await go_on.wait()
            return taken

        monkeypatch.setattr(db, "claim_bot_reply", slow_claim)
        bots = asyncio.create_task(send(runtime, HELPER, "the bot's question"))
        await counted.wait()
        monkeypatch.setattr(db, "claim_bot_reply", claim)
        # The bot's reply is counted; a person writes before it is sent.
        assert await send(runtime, ALICE, "morning all", addressed=False) is None
        go_on.set()
        assert await bots is not None
        assert await send(runtime, HELPER, "a question after the person") is not None
