"""Deletions and edits as slack-bolt delivers them to the adapter (issue 25, item 4):
signed Events API requests carrying Slack's `message_deleted` and `message_changed`
events (tests/fakes/slack_server.py), with a recording runtime (what the runtime then
does is tests/integration/test_deletion_slack.py's).
"""

from __future__ import annotations

from typing import Any

import aiohttp

from adapters.slack import SlackAdapter
from tests.fakes.recording_runtime import RecordingRuntime
from tests.fakes.slack_server import (
    FakeSlack,
    message_changed_event,
    message_deleted_event,
    post_signed,
)
from tests.slack.conftest import (
    SECRET,
    MemoryStore,
    adapter_for,
    adapter_url,
    dm_event,
    running,
)

TS = "1700000000.000100"


async def send(http: aiohttp.ClientSession, adapter: SlackAdapter, body: dict[str, Any]) -> None:
    status, _, _ = await post_signed(http, adapter_url(adapter), SECRET, json_body=body)
    assert status == 200


async def test_deletions_say_where_they_happened(
    fake: FakeSlack, runtime: RecordingRuntime, store: MemoryStore, http: aiohttp.ClientSession
) -> None:
    async with running(adapter_for(fake, runtime, store)) as adapter:
        await send(http, adapter, dm_event(event_id="H1", text="psst"))  # U1's DM is D0001
        await fake.wait_for(fake.posts, what="DM reply")
        deletions: list[tuple[str, dict[str, Any] | None]] = [
            ("C0001", {"type": "message", "user": "U2", "text": "hi"}),
            ("D0009", {"type": "message", "user": "U2", "text": "hi"}),
            ("D0001", None),  # no previous message: the DM's channel tells whose it is
            ("D0077", None),  # nor that: only a kept answer could tell
        ]
        for n, (channel, previous) in enumerate(deletions):
            body = message_deleted_event(
                team="T0001", event_id=f"X{n}", channel=channel, deleted_ts=TS, previous=previous
            )
            await send(http, adapter, body)
        await fake.wait_for(lambda: len(runtime.deleted) == 4, what="the deletions")
    assert sorted(runtime.deleted, key=str) == sorted(
        [
            ("slack", f"C0001/{TS}", "slack:T0001"),
            ("slack", f"D0009/{TS}", "slack:T0001:dm:U2"),
            ("slack", f"D0001/{TS}", "slack:T0001:dm:U1"),
            ("slack", f"D0077/{TS}", None),
        ],
        key=str,
    )
    assert [m.message_id for m in runtime.messages] == [f"D0001/{TS}"]


async def test_an_edit_is_handed_over_and_answered_again(
    fake: FakeSlack, runtime: RecordingRuntime, store: MemoryStore, http: aiohttp.ClientSession
) -> None:
    async with running(adapter_for(fake, runtime, store)) as adapter:
        await send(http, adapter, dm_event(event_id="H1", text="first words"))
        await fake.wait_for(fake.posts, what="DM reply")
        edits = [
            ("D0001", "second words", {}),
            ("C0001", "no longer for the bot", {}),
            ("C0001", "<@UBOT> now for the bot", {}),
            ("D0001", "a bot's edit", {"bot_id": "B9"}),
        ]
        for n, (channel, text, extra) in enumerate(edits):
            body = message_changed_event(
                team="T0001",
                event_id=f"E{n}",
                channel=channel,
                ts=TS,
                user="U1",
                text=text,
                previous_text="first words",
            )
            body["event"]["message"].update(extra)
            await send(http, adapter, body)
        await fake.wait_for(lambda: len(runtime.edited) == 3, what="the edits")
        await fake.wait_for(lambda: len(fake.posts()) == 3, what="the new answers")
        await fake.settle()
    # (Each event is handled in a task of its own: their order may vary.)
    assert sorted(runtime.edited, key=str) == sorted(
        [
            ("slack", f"D0001/{TS}", "second words"),
            ("slack", f"C0001/{TS}", "no longer for the bot"),
            ("slack", f"C0001/{TS}", "now for the bot"),
        ],
        key=str,
    )
    # An edit that no longer mentions the bot goes to the runtime as a message that did
    # not address it (a free channel answers those too; this runtime, as a mention
    # channel, does not).
    assert sorted((m.text, m.message_id, m.addressed) for m in runtime.messages) == [
        ("first words", f"D0001/{TS}", True),
        ("no longer for the bot", f"C0001/{TS}", False),
        ("now for the bot", f"C0001/{TS}", True),
        ("second words", f"D0001/{TS}", True),
    ]
    in_dm, in_channel = sorted(fake.posts()[1:], key=lambda p: str(p["channel"]), reverse=True)
    assert in_dm["channel"] == "D0001" and in_dm.get("thread_ts") is None
    assert in_channel["channel"] == "C0001" and in_channel["thread_ts"] == TS  # its thread
