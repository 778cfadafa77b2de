"""Deleting or editing a message on Slack takes its influence back (issue 25, item 4),
through the real slack-bolt against signed Events API deliveries of Slack's
`message_deleted` and `message_changed` events (tests/fakes/slack_server.py), and the
real runtime.

In a channel (the app subscribed to the channel's messages) the argument that moved a
belief is deleted: the opinions equal, within 1e-9, those of a workspace that never saw
it; its word and ids are in no table and no file of Chroma; the version says "deleted
by its author". The same when the argument, a thread parent (the bot answers in the
message's thread), is deleted while its replies are left: Slack then replaces it with a
`tombstone` (`message_changed`) and sends `message_deleted` only later, which then
changes nothing. In a DM (message.im) an edited argument is taken back and the new
words answered as a new message; an edit that changes no word does nothing.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from providers.anthropic import AnthropicLLM
from tests.fakes.anthropic_server import AnthropicFake
from tests.fakes.slack_server import (
    FakeSlack,
    FakeUser,
    message_changed_event,
    message_deleted_event,
    message_tombstoned_event,
)
from tests.integration.deletion_scenario import (
    ARGUER,
    CHATTER,
    CRITIC,
    DELETED,
    EDITED,
    OWN_TOPIC,
    WORD,
    Role,
    deletion_rows,
    interaction_of,
    play,
    tables_holding,
    taken_back,
    teach,
    until,
)
from tests.integration.forget_scenario import (
    assert_same_opinions_rebased,
    differs_somewhere,
    files_holding,
    no_automatic_reflection,  # noqa: F401 (fixture)
)
from tests.integration.test_dm_powers import slack_dm
from tests.integration.test_slack_e2e import SlackBot, slack_bot, slack_settings
from tests.slack.conftest import fake_slack, http_session, mention_event  # noqa: F401

pytestmark = pytest.mark.usefixtures("no_automatic_reflection")

IDS = {ARGUER: "UARI4K2M1", CRITIC: "UCRIS8P3Q", CHATTER: "UCHAS5T6W"}
CHANNEL = "C0001"
WAIT = 10.0


@pytest.fixture
async def bot(
    tmp_path: Path, llm: AnthropicLLM, fake: FakeSlack, http: aiohttp.ClientSession
) -> AsyncIterator[SlackBot]:
    fake.users.update({i: FakeUser(i, r.title()) for r, i in IDS.items()})
    settings = slack_settings(tmp_path / "data", fake, SLACK_ALLOW_DMS=True)
    async with slack_bot(settings, llm, fake, http) as stack:
        yield stack


async def test_a_deleted_channel_argument_takes_its_influence_back(
    bot: SlackBot, tmp_path: Path, anthropic_server: AnthropicFake
) -> None:
    teach(anthropic_server.brain)

    async def say(community: str, role: Role, text: str) -> str:
        reply = await bot.mention(f"<@UBOT> {text}", team=community, user=IDS[role])
        return str(reply["thread_ts"])  # the ts of the message it answers

    played = await play(say, "T1", "T2")
    ts = played.deleted
    agent, never_saw = await bot.agent("slack:T1"), await bot.agent("slack:T2")
    heard_all = agent.sponge.model_copy(deep=True)
    assert OWN_TOPIC in heard_all.opinion_vectors  # committed after the cooling period
    ref = f"slack:{CHANNEL}/{ts}"
    interaction_id = await interaction_of(bot.runtime.db, ref)
    # (The bare ts is in `seen_events` too: this test's event ids are made from it.)
    needles = [WORD, f"{CHANNEL}/{ts}", str(interaction_id)]
    assert await tables_holding(bot.runtime.db, needles)

    # A message the bot never answered, deleted: no version, nothing changes.
    versions = len(await bot.runtime.db.community("slack:T1").versions(limit=1000))
    rows = await deletion_rows(bot.runtime.db)
    status, _ = await bot.deliver(
        message_deleted_event(
            team="T1",
            event_id="EvGone1",
            channel=CHANNEL,
            deleted_ts="1699999999.000100",
            previous={"type": "message", "user": IDS[CHATTER], "text": "brb"},
        )
    )
    assert status == 200

    async def tombstone_written() -> bool:
        return await deletion_rows(bot.runtime.db) > rows

    await until(tombstone_written, "the deletion of an unseen message")
    assert len(await bot.runtime.db.community("slack:T1").versions(limit=1000)) == versions
    assert agent.sponge == heard_all

    status, _ = await bot.deliver(
        message_deleted_event(
            team="T1",
            event_id="EvGone2",
            channel=CHANNEL,
            deleted_ts=ts,
            previous={"type": "message", "user": IDS[ARGUER], "text": f"<@UBOT> {WORD}"},
        )
    )
    assert status == 200
    await until(taken_back(bot.runtime.db, ref), "the argument to be taken back")

    assert_same_opinions_rebased(agent.sponge, never_saw.sponge)
    assert differs_somewhere(agent.sponge, heard_all)
    [latest] = await bot.runtime.db.community("slack:T1").versions(limit=1)
    assert latest.cause == "message-deleted" and "deleted by its author" in latest.change
    assert WORD not in latest.change
    await agent.flush_episodes()
    assert await tables_holding(bot.runtime.db, needles) == []
    assert agent.episodes.stored([str(interaction_id)]) == []
    settings = slack_settings(tmp_path / "data", bot.fake)
    assert files_holding([settings.resolved_chroma_dir], [WORD]) == []


async def test_a_deleted_thread_parent_is_taken_back_at_its_tombstone(
    bot: SlackBot,
    tmp_path: Path,
    anthropic_server: AnthropicFake,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The bot answered the argument in its thread, so deleting it leaves a tombstone
    (Slack sends no message_deleted while the bot's reply is there): that takes it
    back. A message_deleted for it afterwards (once the replies are gone) is harmless."""
    teach(anthropic_server.brain)
    replies: dict[str, dict[str, object]] = {}

    async def say(community: str, role: Role, text: str) -> str:
        reply = await bot.mention(f"<@UBOT> {text}", team=community, user=IDS[role])
        ts = str(reply["thread_ts"])  # the ts of the message it answers, in its thread
        replies[ts] = reply
        return ts

    played = await play(say, "T1", "T2")
    ts = played.deleted
    assert replies[ts]["channel"] == CHANNEL and replies[ts]["thread_ts"] == ts
    agent, never_saw = await bot.agent("slack:T1"), await bot.agent("slack:T2")
    heard_all = agent.sponge.model_copy(deep=True)
    assert OWN_TOPIC in heard_all.opinion_vectors
    ref = f"slack:{CHANNEL}/{ts}"
    interaction_id = await interaction_of(bot.runtime.db, ref)
    needles = [WORD, f"{CHANNEL}/{ts}", str(interaction_id)]
    assert await tables_holding(bot.runtime.db, needles)
    argument = {"type": "message", "user": IDS[ARGUER], "text": f"<@UBOT> {DELETED}"}

    status, _ = await bot.deliver(
        message_tombstoned_event(
            team="T1",
            event_id="EvTomb1",
            channel=CHANNEL,
            ts=ts,
            previous=argument,
            replies=[("UBOT", "1700000999.000100")],
        )
    )
    assert status == 200
    await until(taken_back(bot.runtime.db, ref), "the tombstoned argument to be taken back")

    assert_same_opinions_rebased(agent.sponge, never_saw.sponge)
    assert differs_somewhere(agent.sponge, heard_all)
    versions = await bot.runtime.db.community("slack:T1").versions(limit=1000)
    assert versions[0].cause == "message-deleted" and "deleted by its author" in versions[0].change
    assert WORD not in versions[0].change
    await agent.flush_episodes()
    assert await tables_holding(bot.runtime.db, needles) == []
    assert agent.episodes.stored([str(interaction_id)]) == []
    settings = slack_settings(tmp_path / "data", bot.fake)
    assert files_holding([settings.resolved_chroma_dir], [WORD]) == []

    # The replies deleted too, Slack sends message_deleted for it: nothing left to take back.
    taken = agent.sponge.model_copy(deep=True)
    rows = await deletion_rows(bot.runtime.db)
    status, _ = await bot.deliver(
        message_deleted_event(
            team="T1", event_id="EvGone3", channel=CHANNEL, deleted_ts=ts, previous=argument
        )
    )
    assert status == 200

    async def handled() -> bool:  # a finished row, taking back no answer
        return await deletion_rows(bot.runtime.db) > rows

    await until(handled, "the second deletion")
    assert await bot.runtime.db.open_deletions() == []
    assert len(await bot.runtime.db.community("slack:T1").versions(limit=1000)) == len(versions)
    assert agent.sponge == taken
    assert await tables_holding(bot.runtime.db, needles) == []
    assert [r for r in caplog.records if r.levelno >= logging.ERROR] == []


async def test_an_edited_dm_argument_is_answered_again_as_a_new_message(
    bot: SlackBot, anthropic_server: AnthropicFake
) -> None:
    """In U1's DM (message.im) the argument is edited; U2's DM hears the other messages
    and then the new words: the two DM personalities then hold the same opinions."""
    teach(anthropic_server.brain)
    dms = {"slack:T1:dm:U1": ("U1", "D0001"), "slack:T1:dm:U2": ("U2", "D0002")}

    async def say(community: str, role: Role, text: str) -> str:
        user, channel = dms[community]
        return await slack_dm(bot, text, user=user, channel=channel)

    played = await play(say, "slack:T1:dm:U1", "slack:T1:dm:U2")
    ts = played.deleted
    agent, other = await bot.agent("slack:T1:dm:U1"), await bot.agent("slack:T1:dm:U2")
    before = agent.sponge.model_copy(deep=True)
    posts = len(bot.fake.posts())

    # Slack sends message_changed for an unfurl too: the same words, nothing to do.
    same = await bot.runtime.message_edited("slack", f"D0001/{ts}", DELETED)
    assert same is False and agent.sponge == before

    status, _ = await bot.deliver(
        message_changed_event(
            team="T1",
            event_id="EvEdit1",
            channel="D0001",
            ts=ts,
            user="U1",
            text=EDITED,
            previous_text=DELETED,
        )
    )
    assert status == 200
    await bot.fake.wait_for(lambda: len(bot.fake.posts()) > posts, what="the new answer")
    await bot.runtime.drain()
    await slack_dm(bot, EDITED, user="U2", channel="D0002")

    versions = await bot.runtime.db.community("slack:T1:dm:U1").versions(limit=2)
    assert [v.cause for v in versions] == ["interaction", "message-deleted"]
    assert "edited by its author" in versions[1].change
    assert_same_opinions_rebased(agent.sponge, other.sponge)
    assert differs_somewhere(agent.sponge, before)
    assert await tables_holding(bot.runtime.db, [WORD]) == []
