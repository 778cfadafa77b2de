"""Slack adapter in Socket Mode: slack_sdk's aiohttp client against the fake websocket."""

from __future__ import annotations

from typing import Any

import aiohttp
import pytest

from adapters.slack import SlackAdapter
from bot.interface import StartupError
from tests.fakes.recording_runtime import RecordingRuntime
from tests.fakes.slack_server import FakeSlack
from tests.slack.conftest import (
    APP_TOKEN,
    MemoryStore,
    adapter_for,
    adapter_url,
    command_form,
    mention_event,
    running,
)


def socket_adapter(
    fake: FakeSlack, runtime: RecordingRuntime, store: MemoryStore, **settings: Any
) -> SlackAdapter:
    settings = {"SLACK_APP_TOKEN": APP_TOKEN, "SLACK_SIGNING_SECRET": None, **settings}
    return adapter_for(fake, runtime, store, **settings)


async def test_events_and_commands_are_acked_by_envelope_and_answered(
    fake: FakeSlack, runtime: RecordingRuntime, store: MemoryStore
) -> None:
    async with running(socket_adapter(fake, runtime, store)) as adapter:
        assert adapter.http_port is None, "no HTTP endpoint without OAuth in Socket Mode"
        [opened] = fake.calls("apps.connections.open")
        assert opened.token == APP_TOKEN
        await fake.wait_for(lambda: fake.ws_connections == 1, what="websocket")

        env = await fake.push_envelope("events_api", mention_event(text="<@UBOT> over the socket"))
        assert (await fake.wait_for_ack(env)) == {"envelope_id": env}
        await fake.wait_for(fake.posts, what="reply")

        form = command_form(fake, "status", rid="sock")
        cmd = await fake.push_envelope("slash_commands", form, accepts_response_payload=True)
        assert (await fake.wait_for_ack(cmd))["envelope_id"] == cmd
        await fake.wait_for(lambda: fake.responses.get("sock"), what="command answer")
        await fake.settle()

    [post] = fake.posts()
    assert post["channel"] == "C0001" and post["thread_ts"] == "1700000000.000100"
    assert runtime.messages[0].text == "over the socket"
    assert runtime.messages[0].community.id == "slack:T0001"
    [answer] = fake.responses["sock"]
    assert answer["response_type"] == "ephemeral" and "status done" in answer["text"]
    assert runtime.commands[0].name == "status"


async def test_redelivered_envelope_is_acked_but_not_answered_twice(
    fake: FakeSlack, runtime: RecordingRuntime, store: MemoryStore
) -> None:
    event = mention_event(event_id="EvSock")
    async with running(socket_adapter(fake, runtime, store)):
        first = await fake.push_envelope("events_api", event)
        await fake.wait_for_ack(first)
        await fake.wait_for(fake.posts, what="reply")
        again = await fake.push_envelope("events_api", event, retry_attempt=1)
        await fake.wait_for_ack(again)
        await fake.settle()
    assert len(fake.posts()) == 1
    assert len(runtime.messages) == 1


async def test_rejected_app_token_is_a_startup_error(
    fake: FakeSlack, runtime: RecordingRuntime, store: MemoryStore
) -> None:
    fake.app_token_prefix = "xapp-other-"
    with pytest.raises(StartupError, match="SLACK_APP_TOKEN"):
        async with running(socket_adapter(fake, runtime, store)):
            pass
    with pytest.raises(StartupError, match="xapp"):
        socket_adapter(fake, runtime, store, SLACK_APP_TOKEN="xoxb-wrong-kind")


async def test_socket_mode_oauth_serves_only_the_install_pages(
    fake: FakeSlack, runtime: RecordingRuntime, store: MemoryStore, http: aiohttp.ClientSession
) -> None:
    adapter = socket_adapter(
        fake, runtime, store, SLACK_BOT_TOKEN=None, SLACK_CLIENT_ID="1.2", SLACK_CLIENT_SECRET="s"
    )
    async with running(adapter):
        async with http.get(adapter_url(adapter, "/slack/install")) as resp:
            assert resp.status == 200 and "slack.com/oauth/v2/authorize" in await resp.text()
        # No events endpoint: in Socket Mode there is no signing secret to check it with.
        async with http.post(adapter_url(adapter), data=b"{}") as resp:
            assert resp.status in (404, 405)
    assert len(store.states) == 1
