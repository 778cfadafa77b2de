"""Slack's thinking status and streaming in an assistant (DM) thread, with real
slack-bolt / slack-sdk against the fake Slack and a runtime that streams its answer."""

from __future__ import annotations

import asyncio

import aiohttp

from bot.messages import IncomingMessage, Reply
from sonality.llm import TextSink
from tests.fakes.recording_runtime import RecordingRuntime
from tests.fakes.slack_server import FakeSlack, post_signed
from tests.slack.conftest import SECRET, MemoryStore, adapter_for, adapter_url, dm_event, running

PIECES = ["Tides ", "follow ", "the ", "moon. ", "The ", "sun ", "helps ", "a ", "little."]


async def test_a_dm_thread_shows_thinking_then_streams_the_reply(
    fake: FakeSlack, runtime: RecordingRuntime, store: MemoryStore, http: aiohttp.ClientSession
) -> None:
    fake.streaming = True
    statuses_when_streaming: list[int] = []

    async def stream(message: IncomingMessage, on_text: TextSink) -> Reply:
        statuses_when_streaming.append(len(fake.statuses))
        for piece in PIECES:
            await on_text(piece)
            await asyncio.sleep(0.15)
        return Reply(text="".join(PIECES), streamed=True)

    runtime.stream = stream
    thread = "1700000000.000050"
    async with running(adapter_for(fake, runtime, store, SLACK_ALLOW_DMS=True)) as adapter:
        body = dm_event(event_id="S1", text="why tides?", thread_ts=thread)
        status, _, _ = await post_signed(http, adapter_url(adapter), SECRET, json_body=body)
        assert status == 200
        await fake.wait_for(
            lambda: any(s["stopped"] for s in fake.streams.values()), what="the stream's end"
        )
    assert fake.statuses == [("D0001", thread, "is thinking…")]
    assert statuses_when_streaming == [1]  # the status was up before the text came
    [streamed] = fake.streams.values()
    assert streamed["thread_ts"] == thread and streamed["text"] == "".join(PIECES)
    assert streamed["appends"] >= 1
    assert fake.posts() == []
