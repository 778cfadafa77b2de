"""A command's file over Discord's attachment limit (a heavy member's my-data export):
the fake refuses it as Discord does (413, code 40005), so the adapter sends it zipped,
and names one that is still too large instead of leaving "thinking…" on screen."""

from __future__ import annotations

import io
import json
import os
import zipfile

from bot.messages import Attachment, CommandResult
from tests.adapters.conftest import *  # noqa: F403  (fixtures)
from tests.adapters.test_discord import guild_and_channel, running
from tests.fakes.discord_server import ATTACHMENT_SIZE_LIMIT, FakeDiscord, FakeUser
from tests.fakes.recording_runtime import RecordingRuntime


async def my_data(fake: FakeDiscord, runtime: RecordingRuntime, alice: FakeUser, data: bytes):
    """Run my-data answering with `data`; the request that edited the answer in."""
    runtime.command_result = lambda r: CommandResult(
        text="Everything I keep about you here.",
        title="Your data",
        files=(Attachment(name="my-data.json", data=data, mime_type="application/json"),),
        private=True,
    )
    guild, channel = guild_and_channel(fake)
    async with running(fake, runtime):
        _, token = await fake.interaction_create(
            guild=guild, channel=channel, user=alice, subcommand="my-data"
        )
        [patch] = await fake.wait_for(lambda r: r.method == "PATCH" and token in r.path)
    return patch


async def test_a_file_over_the_limit_goes_zipped(
    fake: FakeDiscord, runtime: RecordingRuntime, alice: FakeUser
) -> None:
    rows = [{"message": f"message {i} " + "about rent control " * 20} for i in range(30_000)]
    data = json.dumps(rows).encode()
    assert len(data) > ATTACHMENT_SIZE_LIMIT
    patch = await my_data(fake, runtime, alice, data)
    [(name, sent)] = patch.files
    assert name == "my-data.json.zip" and len(sent) <= ATTACHMENT_SIZE_LIMIT
    with zipfile.ZipFile(io.BytesIO(sent)) as archive:
        assert archive.read("my-data.json") == data
    assert patch.json["content"] == "**Your data**\nEverything I keep about you here."


async def test_a_file_too_large_even_zipped_is_named_not_sent(
    fake: FakeDiscord, runtime: RecordingRuntime, alice: FakeUser
) -> None:
    data = os.urandom(ATTACHMENT_SIZE_LIMIT + 1)  # random bytes do not zip smaller
    patch = await my_data(fake, runtime, alice, data)
    assert patch.files == []
    assert "my-data.json is 8.0 MB, more than Discord lets me attach here" in patch.json["content"]
    assert "it was not sent" in patch.json["content"]
