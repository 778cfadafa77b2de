"""Fixtures for the Slack adapter tests: fake Slack, a recording runtime, memory storage.

The runtime here is our own `ChatRuntime` protocol recorded in memory (the real one
comes from `app.wiring.open_runtime`); Slack itself is the loopback fake, never a mock.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from datetime import datetime
from typing import Any

import aiohttp
import pytest

from adapters.slack import SlackAdapter, SlackStore
from bot.interface import ChatRuntime
from bot.messages import (
    CommandResult,
)
from bot.settings import Settings
from tests.fakes.recording_runtime import RecordingRuntime
from tests.fakes.slack_server import FakeSlack, FakeUser, event_envelope

SECRET = "8f742231b10e8888abcd99yyyzzz85a5"
BOT_TOKEN = "xoxb-test-token"
APP_TOKEN = "xapp-1-A0001-test"


class MemoryStore:
    """In-memory `SlackStore`; one instance shared by two adapters = a restart."""

    def __init__(self) -> None:
        self.seen: dict[tuple[str, str], datetime] = {}
        self.installations: list[tuple[dict[str, Any], dict[str, Any]]] = []
        self.states: dict[str, datetime] = {}
        # (community, reply, member) -> thumbs up?; communities the bot keeps data for.
        self.feedback: dict[tuple[str, str, str], bool] = {}
        self.communities: set[str] = set()

    async def mark_event_seen(
        self, platform: str, event_id: str, at: datetime, ttl_seconds: int
    ) -> bool:
        key = (platform, event_id)
        first = key not in self.seen or (at - self.seen[key]).total_seconds() > ttl_seconds
        if first:
            self.seen[key] = at
        return first

    async def save_installation(self, key: dict[str, Any], data: dict[str, Any]) -> None:
        self.installations.append((key, data))

    async def find_installation(
        self,
        enterprise_id: str | None,
        team_id: str | None,
        user_id: str | None = None,
        is_enterprise_install: bool = False,
    ) -> dict[str, Any] | None:
        for key, data in reversed(self.installations):
            if key["enterprise_id"] == enterprise_id and key["team_id"] == team_id:
                if user_id is None or key["user_id"] == user_id:
                    return data
        return None

    async def delete_installation(
        self, enterprise_id: str | None, team_id: str | None, user_id: str | None = None
    ) -> None:
        self.installations = [
            (k, d)
            for k, d in self.installations
            if not (
                k["enterprise_id"] == enterprise_id
                and k["team_id"] == team_id
                and (user_id is None or k["user_id"] == user_id)
            )
        ]

    async def issue_oauth_state(self, state: str, expires_at: datetime) -> None:
        self.states[state] = expires_at

    async def consume_oauth_state(self, state: str, now: datetime) -> bool:
        expires = self.states.pop(state, None)
        return expires is not None and now < expires

    async def record_feedback(
        self,
        community_id: str,
        reply_id: str,
        member_id: str,
        positive: bool,
        at: datetime,
        *,
        replaces: str | None = None,
    ) -> bool:
        if community_id not in self.communities:
            return False
        self.feedback.pop((community_id, replaces or "", member_id), None)
        self.feedback[(community_id, reply_id, member_id)] = positive
        return True


def slack_values(fake: FakeSlack, **overrides: Any) -> dict[str, Any]:
    """Every Slack setting explicit, so neither .env nor the environment leaks in."""
    return {
        "SLACK_BOT_TOKEN": BOT_TOKEN,
        "SLACK_APP_TOKEN": None,
        "SLACK_SIGNING_SECRET": SECRET,
        "SLACK_CLIENT_ID": None,
        "SLACK_CLIENT_SECRET": None,
        "SLACK_API_URL": fake.base_url,
        "SLACK_PORT": 3000,
        "SLACK_MODERATOR_IDS": "",
        "SLACK_ALLOW_DMS": True,
        **overrides,
    }


def make_settings(fake: FakeSlack, **overrides: Any) -> Settings:
    return Settings(_env_file=None, **slack_values(fake, **overrides))  # type: ignore[call-arg]


def adapter_for(
    fake: FakeSlack, runtime: ChatRuntime, store: SlackStore, **settings: Any
) -> SlackAdapter:
    """An adapter on loopback; port 0 lets the OS pick a free port (see `http_port`)."""
    return SlackAdapter(runtime, make_settings(fake, **settings), store, host="127.0.0.1", port=0)


def adapter_url(adapter: SlackAdapter, path: str = "/slack/events") -> str:
    return f"http://127.0.0.1:{adapter.http_port}{path}"


@contextlib.asynccontextmanager
async def running(adapter: SlackAdapter) -> AsyncIterator[SlackAdapter]:
    """start() in a task, wait until ready (or fail with start's error), close after."""
    task = asyncio.create_task(adapter.start())
    ready = asyncio.create_task(adapter.wait_ready())
    try:
        done, _ = await asyncio.wait({task, ready}, timeout=10, return_when="FIRST_COMPLETED")
        if task in done:
            task.result()  # raises start()'s error
            raise AssertionError("start() returned before ready")
        assert ready in done, "adapter did not become ready"
        yield adapter
    finally:
        ready.cancel()
        await adapter.close()
        await asyncio.wait_for(task, timeout=15)


# Named fixtures, so the end-to-end tests can import them without shadowing warnings.
@pytest.fixture(name="fake")
async def fake_slack() -> AsyncIterator[FakeSlack]:
    server = FakeSlack()
    server.users = {
        "U1": FakeUser("U1", "Alice"),
        "U2": FakeUser("U2", "Bob"),
        "UADMIN": FakeUser("UADMIN", "Ada", is_admin=True),
        "UOWNER": FakeUser("UOWNER", "Olga", is_primary_owner=True),
    }
    async with server:
        yield server


@pytest.fixture
def runtime() -> RecordingRuntime:
    return RecordingRuntime(
        refusal="Only moderators can do that.",
        command_result=lambda r: CommandResult(
            text=f"{r.name} done: {' | '.join(r.args)}", title=r.name.title()
        ),
    )


@pytest.fixture
def store() -> MemoryStore:
    return MemoryStore()


@pytest.fixture(name="http")
async def http_session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


def mention_event(
    *,
    event_id: str = "Ev0001",
    team: str = "T0001",
    text: str = "<@UBOT> hello there",
    user: str = "U1",
    channel: str = "C0001",
    ts: str = "1700000000.000100",
    thread_ts: str | None = None,
    **event_extra: Any,
) -> dict[str, Any]:
    """An Events API envelope body as Slack sends it for an @mention."""
    event: dict[str, Any] = {
        "type": "app_mention",
        "user": user,
        "text": text,
        "ts": ts,
        "channel": channel,
        "event_ts": ts,
        "team": team,
        **event_extra,
    }
    if thread_ts:
        event["thread_ts"] = thread_ts
    return event_envelope(team, event_id, event, event_time=1700000000)


def app_home_opened_event(
    *, team: str, user: str, channel: str, tab: str = "messages", event_id: str = "EvHome"
) -> dict[str, Any]:
    """A member opened the app's Messages (or Home) tab; `channel` is their DM with it."""
    body = mention_event(event_id=event_id, team=team, user=user, channel=channel)
    body["event"] = {
        "type": "app_home_opened",
        "user": user,
        "channel": channel,
        "tab": tab,
        "event_ts": body["event"]["event_ts"],
    }
    return body


def dm_event(*, event_id: str, text: str = "hi in private", **extra: Any) -> dict[str, Any]:
    body = mention_event(event_id=event_id, text=text, channel="D0001")
    body["event"].update({"type": "message", "channel_type": "im", **extra})
    return body


def channel_message_event(
    fake: FakeSlack, *, event_id: str, private: bool = False, **fields: Any
) -> dict[str, Any] | None:
    """A `message` event of a channel the app is in (message.channels, or
    message.groups for a private channel), as Slack sends it; None when the app lacks
    the scope, since Slack then sends none (`FakeSlack.sends_channel_messages`)."""
    if not fake.sends_channel_messages(private=private):
        return None
    body = mention_event(event_id=event_id, **fields)
    body["event"].update({"type": "message", "channel_type": "group" if private else "channel"})
    return body


def command_form(
    fake: FakeSlack,
    text: str,
    *,
    user: str = "U1",
    team: str = "T0001",
    rid: str = "r1",
) -> dict[str, str]:
    """A /sonality slash command payload (form fields as Slack posts them)."""
    return {
        "token": "legacy-verification-token",
        "team_id": team,
        "team_domain": "test",
        "channel_id": "C0001",
        "channel_name": "general",
        "user_id": user,
        "user_name": user.lower(),
        "command": "/sonality",
        "text": text,
        "api_app_id": "A0001",
        "is_enterprise_install": "false",
        "response_url": fake.response_url(rid),
        "trigger_id": "1.2.3",
    }
