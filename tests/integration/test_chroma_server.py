"""The bot with CHROMA_URL: episodes kept by a real Chroma server (`chroma run`).

The real runtime, the real Anthropic SDK against its loopback fake, the real MiniLM
model in the bot and chromadb's own HttpClient to a server on 127.0.0.1. Each test has a
Chroma database of its own on the session's server, except those that stop a server,
which start their own.

The whole pipeline file runs on a server too: `SONALITY_TEST_CHROMA=server pytest
tests/integration/test_pipeline.py` (see conftest.make_settings).
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import pytest_asyncio

from app.wiring import open_runtime
from bot.messages import IncomingMessage, ReplyKind
from chroma_memory.community_store import collection_name_for
from chroma_memory.server import ServerMemory
from tests.chroma_server import ChromaServer, free_port, running_chroma_server
from tests.fakes.anthropic_fixtures import FAKE_API_KEY
from tests.forked_bot import start_module
from tests.integration.conftest import (
    BOB,
    A,
    B,
    chat_requests,
    command,
    eventually,
    make_settings,
    prompt_of,
    say,
)
from tests.integration.test_forget_commands import RULES, TOKEN, argue
from tests.integration.test_pipeline import (
    ATOMIC_QUESTION,
    NUCLEAR,
    STRONG_ARGUMENT,
    bob_asks_about_atomic_plants,
)
from tests.integration.test_process import bot_env


def server_settings(tmp_path: Path, server: ChromaServer, llm: Any, **overrides: Any) -> Any:
    return make_settings(
        tmp_path / "data",
        llm=llm,
        CHROMA_URL=server.url,
        SONALITY_CHROMA_DATABASE=server.fresh_database(),
        **overrides,
    )


@pytest_asyncio.fixture
async def runtime(tmp_path: Path, llm: Any, chroma_server: ChromaServer) -> AsyncIterator[Any]:
    async with open_runtime(server_settings(tmp_path, chroma_server, llm), llm=llm) as rt:
        yield rt


def documents(memory: ServerMemory, community_id: str) -> list[str]:
    """Every document the server holds for a community, read over HTTP."""
    collection = memory.chroma.client.get_collection(collection_name_for(community_id))
    return [d or "" for d in collection.get(include=["documents"]).get("documents") or []]


async def test_an_argument_kept_by_the_server_is_recalled_for_another_member(
    runtime, anthropic_server
):
    assert isinstance(runtime.memory, ServerMemory)
    anthropic_server.brain.ess_rule(**NUCLEAR)
    await say(runtime, STRONG_ARGUMENT)
    agent = runtime.registry.get(A.id)
    await agent.flush_episodes()
    assert documents(runtime.memory, A.id) == [NUCLEAR["summary"]]
    assert not (runtime.settings.data_dir / "chromadb").exists()  # nothing kept locally
    await bob_asks_about_atomic_plants(runtime, anthropic_server)


async def test_two_communities_keep_their_episodes_apart_on_the_server(runtime, anthropic_server):
    anthropic_server.brain.ess_rule(**NUCLEAR)
    await say(runtime, STRONG_ARGUMENT, community=A)
    await runtime.registry.get(A.id).flush_episodes()
    reply = await runtime.handle(
        IncomingMessage(community=B, channel_id="c1", user=BOB, text=ATOMIC_QUESTION)
    )
    assert reply is not None and reply.kind is ReplyKind.ANSWER
    assert "<relevant_memories>" not in prompt_of(chat_requests(anthropic_server)[-1])
    await runtime.drain()
    await runtime.registry.get(B.id).flush_episodes()
    assert documents(runtime.memory, A.id) == [NUCLEAR["summary"]]
    assert NUCLEAR["summary"] not in documents(runtime.memory, B.id)


async def test_forget_me_deletes_the_members_episodes_from_the_server(runtime, anthropic_server):
    for rule in RULES:
        anthropic_server.brain.ess_rule(**rule)
    await argue(runtime)
    agent = runtime.registry.get(A.id)
    await agent.flush_episodes()
    assert any(TOKEN in d for d in documents(runtime.memory, A.id))
    others = len(documents(runtime.memory, A.id)) - 1

    done = await command(runtime, "forget-me", "confirm", moderator=False)
    assert done.ok
    left = documents(runtime.memory, A.id)
    assert not any(TOKEN in d for d in left)
    assert len(left) == others  # Bob's and Carol's episodes stay


async def test_a_server_that_dies_mid_run_costs_no_reply_and_no_episode(
    tmp_path, llm, anthropic_server, caplog
):
    """The server stops between two messages: the reply still goes out (without
    memories, and the log says why), learning goes on, and the episode that could not
    be written is written once a server answers on the same address again."""
    path = tmp_path / "chroma-server"
    with running_chroma_server(path) as server:
        port = int(server.url.rsplit(":", 1)[1])
        settings = server_settings(tmp_path, server, llm)
        async with open_runtime(settings, llm=llm) as runtime:
            anthropic_server.brain.ess_rule(**NUCLEAR)
            await say(runtime, STRONG_ARGUMENT)
            agent = runtime.registry.get(A.id)
            assert agent is not None
            await agent.flush_episodes()

            server.process.terminate()
            server.process.wait(10)
            reply = await runtime.handle(
                IncomingMessage(community=A, channel_id="c1", user=BOB, text=ATOMIC_QUESTION)
            )
            assert reply is not None and reply.kind is ReplyKind.ANSWER
            assert "<relevant_memories>" not in prompt_of(chat_requests(anthropic_server)[-1])
            assert "memory retrieval failed" in caplog.text
            assert await eventually(lambda: agent.sponge.interaction_count == 2, 30)
            with pytest.raises(httpx.ConnectError):  # the server is gone
                await agent.flush_episodes()
            assert len(await runtime.db.community(A.id).pending_episodes()) == 1

            with running_chroma_server(path, port):
                await agent.flush_episodes()
                assert await runtime.db.community(A.id).pending_episodes() == []
                assert agent.episodes.count() == 2
                await bob_asks_about_atomic_plants(runtime, anthropic_server)


async def test_a_server_that_cannot_be_reached_at_start_is_one_line_and_exit_2(
    tmp_path: Path, anthropic_server
) -> None:
    """The real `python -m app` (terminal, a message waiting on stdin): no answer, no
    traceback, one line naming the setting."""
    url = f"http://127.0.0.1:{free_port()}"
    proc = await start_module(  # forked: tests/forked_bot.py
        "app",
        cwd=tmp_path,
        env=bot_env(
            tmp_path / "data",
            ANTHROPIC_API_KEY=FAKE_API_KEY,
            ANTHROPIC_BASE_URL=anthropic_server.base_url,
            CHROMA_URL=url,
        ),
    )
    out, err = await asyncio.wait_for(proc.communicate(b"hello, is anyone there?\n"), 120)
    assert proc.returncode == 2, err.decode()
    lines = [line for line in err.decode().splitlines() if line.strip()]
    assert lines == [
        f"error: could not reach the Chroma server CHROMA_URL={url} (connection refused)"
    ]
    assert "Traceback" not in out.decode() and "Sorry" not in out.decode()
    assert not chat_requests(anthropic_server)


@pytest.mark.parametrize(
    ("url", "words"),
    [
        ("chroma:8000", "must be a Chroma server's address"),
        ("http://127.0.0.1:99999", "bad port"),
        ("http://127.0.0.1:8000/api/v2", "only scheme, host and port"),
    ],
)
def test_a_malformed_chroma_url_is_refused_in_one_line(
    tmp_path: Path, url: str, words: str
) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "app"],
        cwd=tmp_path,
        env=bot_env(tmp_path / "data", ANTHROPIC_API_KEY=FAKE_API_KEY, CHROMA_URL=url),
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )
    assert proc.returncode == 2
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith(f"error: CHROMA_URL={url} is not allowed") and words in lines[0]
