"""Other bots on Slack, end to end: real Bolt + slack_sdk ↔ fake Slack, the real runtime
↔ fake Anthropic. A listed bot that mentions the app is answered at most three times in
a row in a channel, until a person writes there; an unlisted bot, and the app itself,
never; a bot's argument is not learned; the answer to a bot is posted whole with its
text escaped, so a mention the model writes in it pings nobody."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any, cast

import aiohttp
import pytest

from providers.anthropic import AnthropicLLM
from tests.fakes.anthropic_server import AnthropicFake
from tests.fakes.slack_server import FakeSlack
from tests.integration.conftest import chat_requests, ess_requests, prompt_of
from tests.integration.test_isolation_and_commands import CANARY, CANARY_TEXT
from tests.integration.test_slack_e2e import T1, SlackBot, slack_bot, slack_settings
from tests.slack.conftest import (  # noqa: F401  (fixtures "fake", "http")
    fake_slack,
    http_session,
    mention_event,
)

#: How Slack describes an app's bot user in the events it posts.
HELPER = {
    "user": "U0HELPER",
    "bot_id": "B0HELPER",
    "bot_profile": {"id": "B0HELPER", "app_id": "A0HELPER", "name": "Helper", "team_id": "T1"},
}
STRANGER = {
    "user": "U0STRANGER",
    "bot_id": "B0STRANGER",
    "bot_profile": {"id": "B0STRANGER", "app_id": "A0STRANGER", "name": "Stranger"},
}
#: The app's own bot user (the fake's `Identity`), listed too: it must never answer itself.
OURSELVES = {"user": "UBOT", "bot_id": "BBOT", "bot_profile": {"id": "BBOT", "name": "sonality"}}


Start = Callable[[str, str], AbstractAsyncContextManager[SlackBot]]


@pytest.fixture
def start(tmp_path: Path, llm: AnthropicLLM, fake: FakeSlack, http: aiohttp.ClientSession) -> Start:
    """`start(data_dir, answer_bots)`: the bot on its own data directory, answering the
    bots listed."""

    def starting(data: str, answer_bots: str) -> AbstractAsyncContextManager[SlackBot]:
        settings = slack_settings(tmp_path / data, fake, SONALITY_ANSWER_BOTS=answer_bots)
        return slack_bot(settings, llm, fake, http)

    return starting


async def from_bot(
    bot: SlackBot, text: str, author: dict[str, Any], *, answered: bool = True
) -> dict[str, Any] | None:
    """A bot's message mentioning the app; its threaded answer, or None once the traffic
    settled without one (with `answered` off)."""
    ts = bot.next_ts()
    before = len(bot.fake.posts())
    event = mention_event(event_id=f"Ev{ts}", team="T1", ts=ts, text=f"<@UBOT> {text}")
    event["event"] = {k: v for k, v in event["event"].items() if k != "user"} | author
    assert (await bot.deliver(event))[0] == 200
    if answered:
        await bot.fake.wait_for(lambda: len(bot.fake.posts()) > before, what=f"reply to {ts}")
    await bot.fake.settle(quiet=0.2)
    await bot.runtime.drain()
    found = [p for p in bot.fake.posts()[before:] if p.get("thread_ts") == ts]
    assert len(found) == (1 if answered else 0), found
    return found[0] if found else None


async def test_a_listed_bot_is_answered_three_times_in_a_row_until_a_person_writes(
    start: Start, fake: FakeSlack, anthropic_server: AnthropicFake
) -> None:
    fake.streaming = True  # a person's answer streams; a bot's is posted whole
    anthropic_server.brain.ess_rule(**cast(dict[str, Any], CANARY))
    anthropic_server.brain.reply_rule(
        contains="road-safety", text="Thanks <@U0HELPER>, noted. <!channel> look!"
    )
    async with start("data", "B0HELPER,BBOT") as bot:
        for _ in range(3):
            post = await from_bot(bot, CANARY_TEXT, HELPER)
            assert post is not None
            # Escaped: Slack shows the text, and pings neither the bot nor the channel.
            assert post["text"] == "Thanks &lt;@U0HELPER&gt;, noted. &lt;!channel&gt; look!"
        assert fake.calls("chat.startStream") == []
        assert "Helper (a bot)" in prompt_of(chat_requests(anthropic_server)[-1])
        calls = len(anthropic_server.requests)
        assert await from_bot(bot, "one more", HELPER, answered=False) is None
        assert len(anthropic_server.requests) == calls  # no model call for it

        # Nothing the bot argued was judged or learned.
        agent = await bot.agent(T1)
        assert ess_requests(anthropic_server) == []
        assert agent.sponge.version == 0 and agent.sponge.opinion_vectors == {}
        assert await bot.runtime.db.community(T1).pending_interactions() == []

        # A person in the channel ends the bots' run (and is learned from as ever); the
        # answer to them streams.
        ts = bot.next_ts()
        person = mention_event(event_id=f"Ev{ts}", team="T1", ts=ts, text=f"<@UBOT> {CANARY_TEXT}")
        assert (await bot.deliver(person))[0] == 200
        await fake.wait_for(lambda: fake.calls("chat.stopStream"), what="the streamed answer")
        await bot.runtime.drain()
        assert len(ess_requests(anthropic_server)) == 1 and agent.sponge.version == 1
        assert await from_bot(bot, "and now?", HELPER) is not None


async def test_an_unlisted_bot_and_the_app_itself_are_never_answered(
    start: Start, fake: FakeSlack, anthropic_server: AnthropicFake
) -> None:
    async with start("data", "B0HELPER,BBOT") as bot:
        assert await from_bot(bot, "hello?", STRANGER, answered=False) is None
        assert await from_bot(bot, "hello?", OURSELVES, answered=False) is None
        assert anthropic_server.requests == [] and fake.calls("reactions.add") == []
        # Listed by its app id alone, without a user (as a workflow's message comes):
        # answered, under the id that was listed.
        workflow = {"bot_id": "B0WORKFLOW", "bot_profile": {"app_id": "A0HELPER", "name": "Flow"}}
        assert await from_bot(bot, "hello?", workflow, answered=False) is None
    async with start("other", "A0HELPER") as bot:
        assert await from_bot(bot, "hello?", workflow) is not None
        assert "Flow (a bot)" in prompt_of(chat_requests(anthropic_server)[-1])
        assert await bot.runtime.db.bot_reply_counts() == {(T1, "C0001"): 1}
