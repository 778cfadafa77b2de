"""Streamed replies on Slack, end to end: real slack-bolt / slack-sdk against the fake
Slack (chat.startStream / appendStream / stopStream with Slack's error shapes, and a
switch for a workspace without them), the real runtime, the anthropic SDK against the
fake streaming at a fixed rate.
"""

from __future__ import annotations

from typing import Any

import pytest

from bot.messages import CUT_OFF
from tests.fakes.anthropic_server import AnthropicFake, Broken, Text
from tests.fakes.slack_server import FakeSlack
from tests.integration.test_slack_e2e import T1, SlackBot, mention_event
from tests.integration.test_slack_e2e import bot as e2e_bot  # noqa: F401
from tests.slack.conftest import fake_slack, http_session  # noqa: F401

ANSWER = " ".join(f"Point {i} of the answer is plain and short." for i in range(10))


@pytest.fixture
def bot(e2e_bot: SlackBot) -> SlackBot:  # noqa: F811 (the imported fixture, by name)
    return e2e_bot


async def _mention(bot: SlackBot, fake: FakeSlack, text: str) -> str:
    ts = bot.next_ts()
    status, _ = await bot.deliver(
        mention_event(event_id=f"Ev{ts}", team="T1", user="U1", ts=ts, text=text)
    )
    assert status == 200
    return ts


def _stopped(fake: FakeSlack) -> list[dict[str, Any]]:
    return [s for s in fake.streams.values() if s["stopped"]]


async def test_a_reply_streams_where_the_workspace_has_streaming(
    bot: SlackBot, fake: FakeSlack, anthropic_server: AnthropicFake
) -> None:
    fake.streaming = True
    anthropic_server.tokens_per_second = 40.0  # ~80 words: about 2 s of writing
    anthropic_server.enqueue(Text(ANSWER))
    ts = await _mention(bot, fake, "<@UBOT> tell me everything")
    await fake.wait_for(lambda: _stopped(fake), within=10, what="the stream's end")
    [stream] = fake.streams.values()
    assert stream["thread_ts"] == ts and stream["text"] == ANSWER
    assert stream["appends"] >= 2  # it grew while the model wrote, not in one go
    start = fake.calls("chat.startStream")[0].args
    assert len(start["markdown_text"]) < len(ANSWER)
    assert start["recipient_user_id"] == "U1" and start["recipient_team_id"] == "T1"
    assert fake.posts() == []  # no second copy as a plain message
    await bot.runtime.drain()
    agent = await bot.agent(T1)
    assert agent.sponge.interaction_count == 1


async def test_without_streaming_the_reply_is_one_post(
    bot: SlackBot, fake: FakeSlack, anthropic_server: AnthropicFake
) -> None:
    assert fake.streaming is False
    anthropic_server.enqueue(Text(ANSWER), Text("Second answer."))
    reply = await bot.mention("<@UBOT> tell me everything")
    assert reply["text"] == ANSWER
    assert fake.streams == {}
    assert len(fake.calls("chat.startStream")) == 1  # tried once ...
    await bot.mention("<@UBOT> and again")
    assert len(fake.calls("chat.startStream")) == 1  # ... and remembered for the team


async def test_a_broken_stream_ends_with_the_note_and_nothing_learned(
    bot: SlackBot, fake: FakeSlack, anthropic_server: AnthropicFake
) -> None:
    fake.streaming = True
    anthropic_server.tokens_per_second = 40.0
    anthropic_server.enqueue(Broken(ANSWER, after=100, how="drop"))
    await _mention(bot, fake, "<@UBOT> tell me everything")
    await fake.wait_for(lambda: _stopped(fake), within=10, what="the stream's end")
    [stream] = fake.streams.values()
    shown, _, note = stream["text"].rpartition("\n\n")
    assert note == CUT_OFF
    assert 100 <= len(shown) < len(ANSWER) and ANSWER.startswith(shown)
    await bot.runtime.drain()
    agent = await bot.agent(T1)
    assert agent.sponge.interaction_count == 0
    assert await bot.runtime.db.community(T1).pending_count() == 0
