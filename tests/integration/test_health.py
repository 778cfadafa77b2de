"""`GET /healthz` (app/health.py): the real runtime, the real SDK against the loopback
Anthropic fake, the real aiohttp server; a controllable clock lets "five minutes of
failures" pass without waiting. The last test drives the real `python -m app` process.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import subprocess
import sys
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from adapters.discord import DiscordAdapter
from app.health import HealthEndpoint, LLMHealth, Platforms, RecordingLLM
from app.wiring import open_runtime
from bot.interface import StartupError
from bot.messages import LLM_DOWN, CommandResult, IncomingMessage
from bot.runtime import Runtime
from sonality.config import DEFAULT_MODEL
from sonality.llm import ChatTurn, LLMError
from storage import Database
from tests.checkout import importing_this_checkout
from tests.fakes.anthropic_fixtures import client_for
from tests.fakes.anthropic_server import AnthropicFake, Fault
from tests.fakes.discord_fixtures import restores_discord_endpoints  # noqa: F401
from tests.fakes.discord_server import FakeDiscord, FakeUser
from tests.fakes.recording_runtime import RecordingRuntime
from tests.fakes.slack_server import FakeSlack
from tests.integration.conftest import ALICE, A, ess_requests, eventually, make_settings
from tests.integration.test_process import _start_bot
from tests.slack.conftest import MemoryStore, adapter_for

THRESHOLD = 300.0


class Clock:
    """A wall clock that moves only when told."""

    def __init__(self) -> None:
        self.now = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)

    def __call__(self) -> datetime:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)


async def get_health(session: aiohttp.ClientSession, port: int) -> tuple[int, dict[str, Any]]:
    async with session.get(f"http://127.0.0.1:{port}/healthz") as response:
        return response.status, await response.json()


@contextlib.asynccontextmanager
async def serving(endpoint: HealthEndpoint) -> AsyncIterator[int]:
    await endpoint.start("127.0.0.1", 0)
    try:
        assert endpoint.port is not None
        yield endpoint.port
    finally:
        await endpoint.close()


async def ask(runtime: Runtime, text: str) -> str:
    reply = await runtime.handle(
        IncomingMessage(community=A, channel_id="c1", user=ALICE, text=text)
    )
    await runtime.drain()
    assert reply is not None
    return reply.text


async def test_503_after_the_model_fails_longer_than_the_threshold_and_200_after_it_answers(
    tmp_path: Path, anthropic_server: AnthropicFake
) -> None:
    clock = Clock()
    llm_health = LLMHealth(clock=clock)
    client = client_for(anthropic_server, max_retries=0)  # one Fault = one failed call
    settings = make_settings(tmp_path / "data")
    try:
        async with (
            open_runtime(settings, llm=client, llm_health=llm_health) as runtime,
            aiohttp.ClientSession() as http,
        ):
            endpoint = HealthEndpoint(runtime.db, llm_health, llm_failing_seconds=THRESHOLD)
            async with serving(endpoint) as port:
                status, body = await get_health(http, port)
                assert status == 200, body
                assert body["status"] == "ok" and body["problems"] == []
                assert body["database"] == {"ok": True}
                assert body["llm"]["last_success_at"] is None  # nothing asked yet

                assert (await ask(runtime, "hello")).startswith("[reply]")
                status, body = await get_health(http, port)
                assert status == 200
                assert body["llm"]["last_success_at"] == clock.now.isoformat()

                # The model starts failing: a single failure is no outage yet.
                anthropic_server.enqueue(Fault(500))
                assert await ask(runtime, "are you there?") == LLM_DOWN
                status, body = await get_health(http, port)
                assert status == 200, body
                model = body["llm"]["models"][DEFAULT_MODEL]
                assert model["consecutive_failures"] == 1
                assert model["failing_since"] == clock.now.isoformat()

                clock.advance(THRESHOLD - 1)
                anthropic_server.enqueue(Fault(500))
                assert await ask(runtime, "still there?") == LLM_DOWN
                status, body = await get_health(http, port)
                assert status == 200, "failing for just under the threshold"
                assert body["llm"]["failing_for_seconds"] == THRESHOLD - 1

                clock.advance(2)
                anthropic_server.enqueue(Fault(529))
                assert await ask(runtime, "hello??") == LLM_DOWN
                status, body = await get_health(http, port)
                assert status == 503, body
                assert body["status"] == "unhealthy"
                assert body["llm"]["ok"] is False
                assert body["llm"]["failing_for_seconds"] == THRESHOLD + 1
                assert body["llm"]["models"][DEFAULT_MODEL]["consecutive_failures"] == 3
                assert any("language model" in p for p in body["problems"])
                assert body["database"] == {"ok": True}  # only the model is down

                # Still down when nobody asks: only an answer ends an outage.
                clock.advance(3600)
                status, _ = await get_health(http, port)
                assert status == 503

                assert (await ask(runtime, "back?")).startswith("[reply]")
                status, body = await get_health(http, port)
                assert status == 200, body
                model = body["llm"]["models"][DEFAULT_MODEL]
                assert model["consecutive_failures"] == 0 and model["failing_since"] is None
                assert model["last_success_at"] == clock.now.isoformat()
    finally:
        await client.aclose()


async def test_a_database_that_does_not_answer_is_503(tmp_path: Path) -> None:
    db = await Database.open(tmp_path / "health.sqlite3")
    endpoint = HealthEndpoint(db, LLMHealth(), llm_failing_seconds=THRESHOLD)
    async with serving(endpoint) as port, aiohttp.ClientSession() as http:
        assert (await get_health(http, port))[0] == 200
        await db.close()
        status, body = await get_health(http, port)
    assert status == 503
    assert body["database"]["ok"] is False and "closed" in body["database"]["error"]
    assert body["problems"] == ["the database does not answer"]


async def test_each_model_is_judged_on_its_own_and_budget_refusals_do_not_count(
    anthropic_server: AnthropicFake,
) -> None:
    """The evidence model answering does not hide a reply model that keeps failing."""
    clock = Clock()
    health = LLMHealth(clock=clock)
    client = client_for(anthropic_server, max_retries=0)
    recording = RecordingLLM(client, health)
    try:
        anthropic_server.enqueue(Fault(500))
        with pytest.raises(LLMError):
            await recording.reply(system=[], messages=[_turn()], max_tokens=10, model="claude-a")
        clock.advance(THRESHOLD + 5)
        anthropic_server.enqueue(Fault(500))
        with pytest.raises(LLMError):
            await recording.reply(system=[], messages=[_turn()], max_tokens=10, model="claude-a")
        await recording.reply(system=[], messages=[_turn()], max_tokens=10, model="claude-b")
    finally:
        await client.aclose()
    ok, report = health.report(THRESHOLD)
    assert not ok
    assert report["models"]["claude-a"]["consecutive_failures"] == 2
    assert report["models"]["claude-b"]["failing_for_seconds"] == 0
    assert report["last_success_at"] == clock.now.isoformat()


def _turn() -> ChatTurn:
    return ChatTurn(role="user", content="hi")


async def test_discord_counts_as_connected_only_while_its_gateway_is_ready(
    tmp_path: Path, anthropic_server: AnthropicFake, llm: Any
) -> None:
    fake = FakeDiscord()
    fake.add_guild("Guild A", members=[FakeUser(9001, "alice", "Alice")])
    await fake.start()
    settings = make_settings(
        tmp_path / "data",
        DISCORD_TOKEN="test-token",
        DISCORD_API_BASE_URL=fake.api_base,
        DISCORD_GATEWAY_URL=fake.gateway_url,
    )
    try:
        async with open_runtime(settings, llm=llm) as runtime:
            adapter = DiscordAdapter(
                runtime, settings, client_options={"guild_ready_timeout": 0.05}, identify_delay=0
            )
            platforms = Platforms()
            task = asyncio.create_task(adapter.start())
            platforms.watch({task: adapter})
            assert platforms.status() == {"discord": False}  # not even connecting yet
            await asyncio.wait_for(adapter.wait_until_ready(), 10)
            assert platforms.status() == {"discord": True}
            await adapter.close()
            await asyncio.wait_for(task, 5)
            assert platforms.status() == {"discord": False}
            await platforms.close()
    finally:
        await fake.close()


async def test_slack_counts_as_connected_once_listening_and_until_it_stops() -> None:
    async with FakeSlack() as fake:
        runtime = RecordingRuntime(refusal="no", command_result=lambda r: CommandResult(text=""))
        adapter = adapter_for(fake, runtime, MemoryStore())
        platforms = Platforms()
        task = asyncio.create_task(adapter.start())
        platforms.watch({task: adapter})
        assert platforms.status() == {"slack": False}
        await asyncio.wait_for(adapter.wait_ready(), 10)
        assert await eventually(lambda: platforms.status() == {"slack": True}, seconds=5)
        await adapter.close()
        await asyncio.wait_for(task, 15)
        assert platforms.status() == {"slack": False}
        await platforms.close()


async def test_a_port_in_use_is_one_clear_startup_error(tmp_path: Path) -> None:
    db = await Database.open(tmp_path / "health.sqlite3")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        endpoint = HealthEndpoint(db, LLMHealth(), llm_failing_seconds=THRESHOLD)
        with pytest.raises(StartupError) as raised:
            await endpoint.start("127.0.0.1", port)
    await db.close()
    assert f"SONALITY_HEALTH_PORT={port}" in str(raised.value)
    assert endpoint.port is None


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


async def poll_health(port: int, seconds: float) -> tuple[int, dict[str, Any]]:
    """The first answer of the endpoint once the bot has started it."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds
    async with aiohttp.ClientSession() as http:
        while True:
            try:
                return await get_health(http, port)
            except aiohttp.ClientConnectionError:
                if loop.time() > deadline:
                    raise
                await asyncio.sleep(0.1)


async def test_the_bot_process_serves_health_and_reports_a_failing_model(
    tmp_path: Path, anthropic_server: AnthropicFake
) -> None:
    """`python -m app` with SONALITY_HEALTH_PORT: 200 once started (the terminal counts as
    connected), 503 after failures spanning more than the threshold (a tiny one, so no
    waiting), 200 again after the model answers; the probe command agrees each time."""
    port = free_port()
    proc = await _start_bot(
        tmp_path / "data",
        anthropic_server.base_url,
        tmp_path,
        SONALITY_HEALTH_PORT=str(port),
        SONALITY_HEALTH_LLM_FAILING_SECONDS="0.000001",
        SONALITY_LLM_MAX_RETRIES="0",
    )
    assert proc.stdin is not None and proc.stdout is not None

    async def say_line(text: str) -> str:
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.write(text.encode() + b"\n")
        await proc.stdin.drain()
        return (await asyncio.wait_for(proc.stdout.readline(), 120)).decode().strip()

    try:
        status, body = await poll_health(port, seconds=120)
        assert status == 200, body
        assert body["platforms"] == {"terminal": {"connected": True}}
        assert body["database"] == {"ok": True}
        assert await probe(port, tmp_path) == 0

        assert (await say_line("hello")).startswith("[reply]")
        assert await eventually(lambda: bool(ess_requests(anthropic_server)), seconds=30)
        anthropic_server.enqueue(Fault(500), Fault(500))
        assert LLM_DOWN in await say_line("first try")
        assert LLM_DOWN in await say_line("second try")
        status, body = await poll_health(port, seconds=5)
        assert status == 503, body
        assert body["llm"]["ok"] is False
        assert await probe(port, tmp_path) == 1

        assert (await say_line("third try")).startswith("[reply]")
        status, body = await poll_health(port, seconds=5)
        assert status == 200, body
        assert await probe(port, tmp_path) == 0
    finally:
        proc.stdin.close()
        code = await asyncio.wait_for(proc.wait(), 60)
    assert code == 0


async def probe(port: int, cwd: Path) -> int:
    """Exit code of the container's HEALTHCHECK command against this port."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "app.healthcheck",
        cwd=cwd,
        env=importing_this_checkout({"SONALITY_HEALTH_PORT": str(port), "PATH": "/usr/bin:/bin"}),
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.DEVNULL,
    )
    return await asyncio.wait_for(proc.wait(), 60)


def test_the_probe_passes_when_the_endpoint_is_off(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "app.healthcheck"],
        cwd=tmp_path,
        env=importing_this_checkout({"PATH": "/usr/bin:/bin"}),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert "SONALITY_HEALTH_PORT" in proc.stdout
