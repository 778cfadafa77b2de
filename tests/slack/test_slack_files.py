"""Files on Slack: the fake's upload v2 endpoints, and the adapter posting a command's
picture to the channel the command came from.

slack_sdk's own `files_upload_v2` drives the fake (files.getUploadURLExternal, the POST
to the returned URL, files.completeUploadExternal), so these tests check that the
fake answers as Slack does, including its refusals, before the adapter relies on it.
"""

from __future__ import annotations

import json
from typing import Any

import aiohttp
import pytest
from slack_sdk.errors import SlackApiError
from slack_sdk.web.async_client import AsyncWebClient

from bot.messages import Attachment, CommandResult
from tests.fakes.recording_runtime import RecordingRuntime
from tests.fakes.slack_server import FakeSlack, Identity, post_signed
from tests.slack.conftest import (
    BOT_TOKEN,
    SECRET,
    MemoryStore,
    adapter_for,
    adapter_url,
    command_form,
    running,
)

PICTURE = b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 40  # bytes of every value


def web_client(fake: FakeSlack, token: str = BOT_TOKEN) -> AsyncWebClient:
    return AsyncWebClient(token=token, base_url=fake.base_url)


async def error_of(call: Any) -> dict[str, Any]:
    with pytest.raises(SlackApiError) as raised:
        await call
    return dict(raised.value.response.data)


# --------------------------------------------------------------------------- the fake


async def test_upload_v2_delivers_the_exact_bytes_to_the_channel(fake: FakeSlack) -> None:
    client = web_client(fake)
    done = await client.files_upload_v2(
        file=PICTURE,
        filename="timeline-v7.png",
        title="Timeline",
        alt_txt="Opinion timeline: nuclear_energy from none to +0.04.",
        channel="C0001",
        initial_comment="How my views moved",
    )
    assert done["ok"] and done["file"]["title"] == "Timeline"
    [upload] = fake.shared_files()
    assert upload.data == PICTURE and upload.length == len(PICTURE)
    assert upload.filename == "timeline-v7.png"
    assert upload.alt_txt == "Opinion timeline: nuclear_energy from none to +0.04."
    assert upload.channels == ("C0001",) and upload.initial_comment == "How my views moved"
    # The three steps, in order, the bytes going to the URL the first step returned.
    steps = [r.path for r in fake.requests]
    assert steps == [
        "/api/files.getUploadURLExternal",
        f"/upload/v1/{upload.key}",
        "/api/files.completeUploadExternal",
    ]
    assert fake.calls("files.getUploadURLExternal")[0].args["length"] == str(len(PICTURE))


async def test_get_upload_url_validates_its_arguments(fake: FakeSlack) -> None:
    client = web_client(fake)
    no_name = await error_of(client.api_call("files.getUploadURLExternal", params={"length": 5}))
    assert no_name["error"] == "invalid_arguments"
    assert no_name["response_metadata"]["messages"] == ["[ERROR] missing required field: filename"]
    not_a_number = await error_of(
        client.api_call("files.getUploadURLExternal", params={"filename": "a.png", "length": "x"})
    )
    assert not_a_number["error"] == "invalid_arguments"
    empty = await error_of(client.files_getUploadURLExternal(filename="a.png", length=0))
    assert empty["error"] == "missing_argument"
    long_alt = await error_of(
        client.files_getUploadURLExternal(filename="a.png", length=3, alt_txt="x" * 1001)
    )
    assert long_alt["error"] == "alt_txt_too_large"
    no_token = await error_of(
        web_client(fake, token="").files_getUploadURLExternal(filename="a.png", length=3)
    )
    assert no_token["error"] == "not_authed"
    assert fake.uploads == {}


async def test_a_token_without_files_write_is_refused_as_slack_does(fake: FakeSlack) -> None:
    scopes = ("chat:write", "commands")
    fake.identities["xoxb-old-install"] = Identity(scopes=scopes)
    refused = await error_of(
        web_client(fake, "xoxb-old-install").files_upload_v2(
            file=PICTURE, filename="t.png", channel="C0001"
        )
    )
    assert refused["error"] == "missing_scope" and refused["needed"] == "files:write"
    assert refused["provided"] == "chat:write,commands"
    assert fake.uploads == {}


async def test_complete_refuses_unknown_unsent_and_repeated_files(fake: FakeSlack) -> None:
    client = web_client(fake)
    unknown = await error_of(
        client.files_completeUploadExternal(files=[{"id": "F404"}], channel_id="C0001")
    )
    assert unknown["error"] == "file_not_found"

    started = await client.files_getUploadURLExternal(filename="t.png", length=len(PICTURE))
    file_id = started["file_id"]
    unsent = await error_of(
        client.files_completeUploadExternal(files=[{"id": file_id}], channel_id="C0001")
    )
    assert unsent["error"] == "file_not_found"

    async with aiohttp.ClientSession() as http:
        async with http.post(started["upload_url"], data=PICTURE[:-1]) as short:
            assert short.status == 400  # not the length announced
        async with http.post(started["upload_url"], data=PICTURE) as sent:
            assert sent.status == 200 and await sent.text() == f"OK - {len(PICTURE)}"
    elsewhere = await error_of(
        client.files_completeUploadExternal(files=[{"id": file_id}], channel_id="nowhere")
    )
    assert elsewhere["error"] == "channel_not_found"
    bad_files = await error_of(
        client.api_call("files.completeUploadExternal", params={"files": json.dumps([{}])})
    )
    assert bad_files["error"] == "invalid_arguments"

    first = await client.files_completeUploadExternal(files=[{"id": file_id}], channel_id="C0001")
    assert first["files"] == [{"id": file_id, "title": "t.png"}]
    again = await error_of(
        client.files_completeUploadExternal(files=[{"id": file_id}], channel_id="C0001")
    )
    assert again["error"] == "file_not_found"
    assert [u.file_id for u in fake.shared_files()] == [file_id]


async def test_sharing_where_the_bot_is_not_a_member_fails(fake: FakeSlack) -> None:
    fake.not_in_channels.add("C0SECRET")
    refused = await error_of(
        web_client(fake).files_upload_v2(file=PICTURE, filename="t.png", channel="C0SECRET")
    )
    assert refused["error"] == "not_in_channel"
    assert fake.shared_files() == []


# --------------------------------------------------------------------------- the adapter


def picture_result(request: Any) -> CommandResult:
    return CommandResult(
        text="Opinion timeline: how my views **moved**.",
        title="Timeline",
        files=(
            Attachment(
                name="timeline-v3.png",
                data=PICTURE,
                mime_type="image/png",
                description="Opinion timeline: one belief.",
            ),
        ),
    )


async def run_timeline(
    fake: FakeSlack,
    runtime: RecordingRuntime,
    store: MemoryStore,
    http: aiohttp.ClientSession,
) -> None:
    async with running(adapter_for(fake, runtime, store)) as adapter:
        form = command_form(fake, "timeline nuclear energy 30")
        assert (await post_signed(http, adapter_url(adapter), SECRET, form=form))[0] == 200
        await fake.wait_for(
            lambda: fake.shared_files() or fake.responses.get("r1"), what="picture or answer"
        )
        await fake.settle(quiet=0.1)


async def test_a_commands_picture_is_uploaded_to_its_channel(
    fake: FakeSlack, runtime: RecordingRuntime, store: MemoryStore, http: aiohttp.ClientSession
) -> None:
    runtime.command_result = picture_result
    await run_timeline(fake, runtime, store, http)
    [request] = runtime.commands
    assert request.name == "timeline" and request.args == ("nuclear", "energy", "30")
    [upload] = fake.shared_files()
    assert upload.data == PICTURE and upload.filename == "timeline-v3.png"
    assert upload.channels == ("C0001",) and upload.title == "Timeline"
    assert upload.alt_txt == "Opinion timeline: one belief."
    assert upload.initial_comment == "Opinion timeline: how my views *moved*."  # mrkdwn
    assert fake.all_responses() == []  # the picture is the answer


async def test_a_picture_that_cannot_be_posted_becomes_a_private_answer_saying_why(
    fake: FakeSlack, runtime: RecordingRuntime, store: MemoryStore, http: aiohttp.ClientSession
) -> None:
    runtime.command_result = picture_result
    fake.not_in_channels.add("C0001")
    await run_timeline(fake, runtime, store, http)
    assert fake.shared_files() == []
    [answer] = fake.responses["r1"]
    assert answer["response_type"] == "ephemeral"
    assert "how my views *moved*" in answer["text"]
    assert "not a member of this channel" in answer["text"] and "/invite" in answer["text"]


async def test_an_install_without_files_write_is_told_to_reinstall(
    fake: FakeSlack, runtime: RecordingRuntime, store: MemoryStore, http: aiohttp.ClientSession
) -> None:
    runtime.command_result = picture_result
    fake.identities[BOT_TOKEN] = Identity(scopes=("chat:write", "commands", "users:read"))
    await run_timeline(fake, runtime, store, http)
    [answer] = fake.responses["r1"]
    assert answer["response_type"] == "ephemeral" and "files:write" in answer["text"]
    assert "reinstall" in answer["text"] and fake.uploads == {}
