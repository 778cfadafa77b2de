"""Multi-workspace (OAuth) Slack: uninstalling removes the workspace's tokens and tells
the runtime; installing again tells it the bot is back."""

from __future__ import annotations

import re

import aiohttp
import pytest

from adapters.slack import SlackAdapter
from tests.fakes.recording_runtime import RecordingRuntime
from tests.fakes.slack_server import (
    FakeSlack,
    OAuthGrant,
    app_uninstalled_event,
    tokens_revoked_event,
)
from tests.slack.conftest import MemoryStore, adapter_for, adapter_url, mention_event, running
from tests.slack.test_slack_http import send


async def install(http: aiohttp.ClientSession, adapter: SlackAdapter, code: str) -> None:
    """The OAuth flow as a browser runs it: the install page, then Slack's redirect."""
    async with http.get(adapter_url(adapter, "/slack/install")) as resp:
        assert resp.status == 200
        page = await resp.text()
        cookie = resp.headers["Set-Cookie"].split(";", 1)[0]
    state = re.search(r"state=([\w\-]+)", page)
    assert state is not None
    redirect = adapter_url(adapter, f"/slack/oauth_redirect?code={code}&state={state.group(1)}")
    async with http.get(redirect, headers={"Cookie": cookie}) as resp:
        assert resp.status == 200, await resp.text()


@pytest.mark.filterwarnings("ignore:BasicAuth is deprecated:DeprecationWarning")
async def test_uninstall_forgets_the_token_and_a_reinstall_brings_the_bot_back(
    fake: FakeSlack, runtime: RecordingRuntime, store: MemoryStore, http: aiohttp.ClientSession
) -> None:
    fake.grants["code-1"] = OAuthGrant(team_id="T0009", bot_token="xoxb-T0009")
    fake.grants["code-2"] = OAuthGrant(team_id="T0009", bot_token="xoxb-T0009-new")
    adapter = adapter_for(
        fake, runtime, store, SLACK_BOT_TOKEN=None, SLACK_CLIENT_ID="1.2", SLACK_CLIENT_SECRET="s"
    )
    async with running(adapter):
        await install(http, adapter, "code-1")
        assert runtime.added == ["slack:T0009"]

        # Users' tokens revoked: their rows go, the bot stays.
        await send(http, adapter, tokens_revoked_event(team="T0009", event_id="R1", oauth=["U7"]))
        await fake.settle(quiet=0.1)
        assert runtime.removed == [] and store.installations

        status, _, _ = await send(http, adapter, app_uninstalled_event(team="T0009", event_id="U1"))
        assert status == 200
        await fake.wait_for(lambda: runtime.removed, what="removal reported")
        assert runtime.removed == [("slack:T0009", "the Slack app was uninstalled")]
        assert store.installations == []  # the revoked token is not kept

        # Without an installation Bolt cannot authorize the team's events: no answer.
        await send(http, adapter, mention_event(event_id="M1", team="T0009"))
        await fake.settle(quiet=0.1)
        assert runtime.messages == []

        await install(http, adapter, "code-2")
        assert runtime.added[-1] == "slack:T0009"
        await send(http, adapter, mention_event(event_id="M2", team="T0009"))
        await fake.wait_for(fake.posts, what="reply after the reinstall")
    [post] = fake.calls("chat.postMessage")
    assert post.token == "xoxb-T0009-new"
