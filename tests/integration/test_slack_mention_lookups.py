"""Mentions of members who do not exist, end to end: real Bolt + slack_sdk ↔ fake Slack,
the real runtime ↔ fake Anthropic. Every `<@U…>` in a message is turned into a name
with users.info (Tier 4: about 100 calls a minute per workspace, shared with the admin
check of moderator commands) before the runtime decides whether to answer, so a member
must not be able to spend that limit with made-up mentions: a message has at most
`MAX_MENTION_LOOKUPS` of its mentions looked up, Slack's "no such user" is remembered
like a name, and the rest stay `@id`."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from adapters.slack import MAX_MENTION_LOOKUPS, MENTION_LOOKUPS_PER_MINUTE
from providers.anthropic import AnthropicLLM
from tests.fakes.anthropic_server import AnthropicFake
from tests.fakes.slack_server import FakeSlack, message_changed_event
from tests.integration.conftest import chat_requests, prompt_of
from tests.integration.test_slack_e2e import SlackBot, slack_bot, slack_settings
from tests.slack.conftest import (  # noqa: F401  (fixtures "fake", "http")
    channel_message_event,
    fake_slack,
    http_session,
)

#: Fifty members nobody has: each users.info of them answers `user_not_found`.
MADE_UP = " ".join(f"<@UFAKE{i:03d}>" for i in range(50))


@pytest.fixture
async def bot(
    tmp_path: Path, llm: AnthropicLLM, fake: FakeSlack, http: aiohttp.ClientSession
) -> AsyncIterator[SlackBot]:
    async with slack_bot(slack_settings(tmp_path / "data", fake), llm, fake, http) as stack:
        yield stack


def looked_up(fake: FakeSlack) -> list[str]:
    """The user of each users.info call, in order."""
    return [str(c.args.get("user")) for c in fake.calls("users.info")]


async def test_a_workspace_looks_up_a_few_mentions_a_minute_whatever_the_messages(
    bot: SlackBot, fake: FakeSlack
) -> None:
    """Messages each with new made-up mentions: past `MENTION_LOOKUPS_PER_MINUTE` in the
    minute, mentions are named from the cache only, so the author lookups (and the admin
    check of commands) keep the rest of users.info's limit."""
    for batch in range(4):
        ids = " ".join(f"<@UNEW{batch}{i:02d}>" for i in range(MAX_MENTION_LOOKUPS))
        await bot.mention(f"<@UBOT> ask {ids}", user="U1", team="T1")
    made_up = [u for u in looked_up(fake) if u.startswith("UNEW")]
    assert len(made_up) == MENTION_LOOKUPS_PER_MINUTE < 4 * MAX_MENTION_LOOKUPS
    assert "U1" in looked_up(fake)  # the author was looked up all the same


async def test_made_up_mentions_cost_a_few_lookups_and_a_repeat_none(
    bot: SlackBot, fake: FakeSlack, anthropic_server: AnthropicFake
) -> None:
    await bot.mention(f"<@UBOT> ask <@U2> and {MADE_UP}", user="U1", team="T1")
    lookups = looked_up(fake)
    # The first mentions in the order they were written, then the author: once each.
    assert lookups[0] == "U2" and "U1" in lookups
    assert len(lookups) == len(set(lookups)) == MAX_MENTION_LOOKUPS + 1, lookups
    prompt = prompt_of(chat_requests(anthropic_server)[-1])
    assert "@Bob" in prompt  # a real member is still named
    assert "@UFAKE000" in prompt and "@UFAKE049" in prompt  # the others stay ids

    # The same message again: every answer is remembered, nothing is asked again.
    await bot.mention(f"<@UBOT> ask <@U2> and {MADE_UP}", user="U1", team="T1")
    assert looked_up(fake) == lookups


async def test_a_message_the_bot_does_not_answer_costs_as_little(
    bot: SlackBot, fake: FakeSlack
) -> None:
    ts = bot.next_ts()
    body = channel_message_event(fake, event_id=f"Ev{ts}", ts=ts, team="T1", text=MADE_UP)
    assert body is not None
    assert (await bot.deliver(body))[0] == 200
    # The author is looked up after the mentions, once the text is read.
    await fake.wait_for(lambda: "U1" in looked_up(fake), what="the author's lookup")
    await fake.settle(quiet=0.2)
    await bot.runtime.drain()
    made_up = [u for u in looked_up(fake) if u.startswith("UFAKE")]
    assert made_up == [f"UFAKE{i:03d}" for i in range(MAX_MENTION_LOOKUPS)]
    assert fake.posts() == []  # a mention channel: not answered


async def test_an_edit_full_of_made_up_mentions_is_read_with_a_few_lookups(
    bot: SlackBot, fake: FakeSlack
) -> None:
    """An answered message edited: its new text is read to take the old words back, and
    again to answer it anew; the mentions in it are looked up once, a few of them."""
    await bot.mention("<@UBOT> what about bikes?", user="U1", team="T1")
    ts = "1700000001.000100"  # the ts `mention` gave the message
    posts = len(fake.posts())
    before = len(looked_up(fake))
    edited = message_changed_event(
        team="T1",
        event_id="EvEdit1",
        channel="C0001",
        ts=ts,
        user="U1",
        text=f"<@UBOT> what about {MADE_UP}?",
        previous_text="<@UBOT> what about bikes?",
    )
    assert (await bot.deliver(edited))[0] == 200
    await fake.wait_for(lambda: len(fake.posts()) > posts, what="the answer to the edit")
    await bot.runtime.drain()
    made_up = looked_up(fake)[before:]
    assert made_up == [f"UFAKE{i:03d}" for i in range(MAX_MENTION_LOOKUPS)], made_up


async def test_an_update_with_the_same_words_is_no_edit_however_its_mentions_render(
    bot: SlackBot, fake: FakeSlack, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Slack resends a message with its words unchanged (an unfurl). Its mention of Bob
    would now render as an id (the cached name expired, and Slack no longer knows him):
    the words Slack holds are the same, so nothing is taken back or answered again."""
    text = "<@UBOT> what does <@U2> think of bikes?"
    await bot.mention(text, user="U1", team="T1")
    ts = "1700000001.000100"  # the ts `mention` gave the message
    await bot.runtime.drain()
    posts, versions = len(fake.posts()), await bot.runtime.db.community("slack:T1").versions()
    monkeypatch.setattr("adapters.slack.USER_CACHE_SECONDS", 0.0)
    fake.users.pop("U2")
    unfurled = message_changed_event(
        team="T1",
        event_id="EvUnfurl1",
        channel="C0001",
        ts=ts,
        user="U1",
        text=text,
        previous_text=text,
    )
    assert (await bot.deliver(unfurled))[0] == 200
    await fake.settle(quiet=0.2)
    await bot.runtime.drain()
    assert len(fake.posts()) == posts
    assert await bot.runtime.db.community("slack:T1").versions() == versions
    assert len(await bot.runtime.db.kept_messages(f"slack:C0001/{ts}")) == 1
