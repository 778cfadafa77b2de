"""The Discord adapter tests' fixtures (test_discord*.py): a fake Discord with one
guild and its member Alice, and a recording runtime. Each test names what it needs;
discord_fixtures' check that the adapter puts Discord's URLs back runs for every test
here."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from bot.messages import CommandResult
from tests.fakes.discord_fixtures import restores_discord_endpoints  # noqa: F401  (autouse)
from tests.fakes.discord_server import FakeDiscord, FakeUser
from tests.fakes.recording_runtime import RecordingRuntime

REFUSAL = "Only moderators (Manage Server) can do that."


@pytest.fixture
def alice() -> FakeUser:
    return FakeUser(9001, "alice", "Alice")


@pytest.fixture
async def fake(alice: FakeUser) -> AsyncIterator[FakeDiscord]:
    server = FakeDiscord()
    server.add_guild("Guild One", members=[alice])
    await server.start()
    yield server
    await server.close()


@pytest.fixture
def runtime() -> RecordingRuntime:
    return RecordingRuntime(
        refusal=REFUSAL,
        command_result=lambda r: CommandResult(text=f"{r.name}({', '.join(r.args)}) ran"),
        completion_pool={"version": ["3", "2", "1"], "topic": ["ethics", "ethereum", "music"]},
    )
