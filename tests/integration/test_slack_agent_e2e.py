"""Slack's agent surface end to end (issue 25): real slack-bolt / slack-sdk against the
fake Slack, the real runtime and storage, the anthropic SDK against its fake.

- A press of the feedback buttons under a streamed reply is stored per reply and
  community, shown to moderators by `/sonality status` (not to members), listed in the
  presser's my-data and taken by their forget-me.
- Forget-me asks with Confirm / Cancel buttons: only the member who asked can answer,
  a question answers once, Cancel and an expired question change nothing. (The typed
  `confirm` of an app created from the old manifest: test_forget_slack.py.)
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any

from adapters.confirm_text import CANCELLED, NOT_YOURS, WORKING, expired_text
from storage.feedback import FeedbackCounts
from tests.fakes.anthropic_server import AnthropicFake
from tests.fakes.slack_server import FakeSlack, interaction_form, post_signed
from tests.integration.test_forget_slack import OTHER, TOKEN
from tests.integration.test_forget_slack import _rate as rate
from tests.integration.test_slack_e2e import T1, SlackBot, bot  # noqa: F401
from tests.slack.conftest import (  # noqa: F401  (fixtures "fake", "http")
    SECRET,
    adapter_url,
    fake_slack,
    http_session,
    mention_event,
)


async def eventually(check: Callable[[], Awaitable[bool]], what: str, within: float = 5.0) -> None:
    """Poll `check` (storage, which the fake does not see) until true."""
    for _ in range(int(within / 0.05)):
        if await check():
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


async def press(bot: SlackBot, payload: dict[str, Any]) -> str:  # noqa: F811
    """Deliver a button press as Slack does (a signed form post); returns the id of the
    response_url that came with it, where the bot's answers to it are recorded."""
    status, body, took = await post_signed(
        bot.http, adapter_url(bot.adapter), SECRET, form=interaction_form(payload)
    )
    assert status == 200 and body == "" and took < 3.0
    return str(payload["response_url"]).rsplit("/", 1)[1]


async def streamed_reply(bot: SlackBot, text: str, user: str = "U1") -> str:  # noqa: F811
    """@mention the bot where Slack streams replies; the ts of its (stopped) reply."""
    before = set(bot.fake.streams)
    ts = bot.next_ts()
    body = mention_event(event_id=f"Ev{ts}", team="T1", user=user, ts=ts, text=text)
    assert (await bot.deliver(body))[0] == 200

    def stopped() -> str | None:
        new = [k for k, s in bot.fake.streams.items() if k not in before and s["stopped"]]
        return new[0] if new else None

    reply: str = await bot.fake.wait_for(stopped, within=10, what="the streamed reply")
    await bot.runtime.drain()
    return reply


def rid_of(fake: FakeSlack, answer: dict[str, Any]) -> str:
    return next(rid for rid, bodies in fake.responses.items() if answer in bodies)


async def export(bot: SlackBot, user: str) -> dict[str, Any]:  # noqa: F811
    await bot.command("my-data", user=user)
    data: dict[str, Any] = json.loads(bot.fake.shared_files()[-1].data or b"{}")
    return data


async def test_a_feedback_press_is_counted_for_moderators_and_forgotten_with_its_member(
    bot: SlackBot,  # noqa: F811
    fake: FakeSlack,
) -> None:
    fake.streaming = True
    db = bot.runtime.db
    reply = await streamed_reply(bot, "<@UBOT> what do you think of tides?")
    assert fake.streams[reply]["blocks"][0]["type"] == "context_actions"

    await press(bot, fake.press_feedback(reply, user="U2", team="T1"))
    await eventually(lambda: _counts_are(db, FeedbackCounts(positive=1, replies=1)), "the vote")
    await press(bot, fake.press_feedback(reply, user="U1", team="T1", positive=False))
    await eventually(
        lambda: _counts_are(db, FeedbackCounts(positive=1, negative=1, replies=1)), "two votes"
    )

    for_moderator = await bot.command("status", user="UADMIN")
    assert "Reply feedback: 1 👍, 1 👎 (on 1 reply)" in for_moderator["text"]
    for_member = await bot.command("status", user="U2")
    assert "Version:" in for_member["text"] and "feedback" not in for_member["text"]

    [mine] = (await export(bot, "U2"))["reply_feedback"]
    assert (mine["reply_id"], mine["positive"]) == (
        f"{fake.streams[reply]['channel']}:{reply}",
        True,
    )

    # A ts is unique only within its channel: a reply elsewhere with the same ts is
    # another reply, and U2's vote on it does not replace the one above.
    elsewhere = fake.press_feedback(reply, user="U2", team="T1", positive=False)
    elsewhere["container"]["channel_id"] = elsewhere["channel"]["id"] = "C0OTHER"
    await press(bot, elsewhere)
    await eventually(
        lambda: _counts_are(db, FeedbackCounts(positive=1, negative=2, replies=2)),
        "a vote on a reply with the same ts in another channel",
    )
    assert len((await export(bot, "U2"))["reply_feedback"]) == 2

    done = await bot.command("forget-me confirm", user="U2")
    assert "Forgotten" in done["text"], done
    assert await db.feedback_counts(T1) == FeedbackCounts(negative=1, replies=1)
    assert (await export(bot, "U2"))["reply_feedback"] == []
    assert len((await export(bot, "U1"))["reply_feedback"]) == 1


async def _counts_are(db: Any, expected: FeedbackCounts) -> bool:
    counts: FeedbackCounts = await db.feedback_counts(T1)
    return counts == expected


async def test_forget_me_asks_with_buttons_only_the_asker_can_confirm(
    bot: SlackBot,  # noqa: F811
    fake: FakeSlack,
    anthropic_server: AnthropicFake,
) -> None:
    rate(anthropic_server, TOKEN)
    rate(anthropic_server, OTHER)
    await bot.mention(f"<@UBOT> A 2023 study ({TOKEN}) found remote work helps.", user="U1")
    await bot.mention(f"<@UBOT> My own study ({OTHER}) agrees.", user="U2")

    asked = await bot.command("forget-me", user="U1")
    assert asked["response_type"] == "ephemeral"
    section, actions = asked["blocks"]
    assert "Press Confirm to go ahead" in section["text"]["text"]
    assert [b["text"]["text"] for b in actions["elements"]] == ["Confirm", "Cancel"]
    question = rid_of(fake, asked)

    # Another member's press: told so in private, nothing forgotten.
    theirs = await press(bot, fake.press_button(question, "Confirm", user="U2", team="T1"))
    await fake.wait_for(lambda: fake.responses.get(theirs), what="the refusal")
    assert fake.responses[theirs] == [
        {"text": NOT_YOURS, "response_type": "ephemeral", "replace_original": False}
    ]
    assert TOKEN in json.dumps(await export(bot, "U1"))

    mine = await press(bot, fake.press_button(question, "Confirm", user="U1", team="T1"))
    await fake.wait_for(lambda: len(fake.responses.get(mine, [])) >= 2, what="the answer")
    working, answer = fake.responses[mine]
    assert working == {"text": WORKING, "response_type": "ephemeral", "replace_original": True}
    assert answer["text"].startswith("*Forgotten*") and answer["replace_original"] is True
    assert (await export(bot, "U1"))["messages"] == []
    assert OTHER in json.dumps(await export(bot, "U2"))

    # The same button again (a double click, before Slack showed the answer): the
    # question was answered once already.
    again = await press(bot, fake.press_button(question, "Confirm", user="U1", team="T1"))
    await fake.settle()
    assert again not in fake.responses


async def test_cancel_or_an_expired_question_forgets_nothing(
    bot: SlackBot,  # noqa: F811
    fake: FakeSlack,
    anthropic_server: AnthropicFake,
) -> None:
    rate(anthropic_server, TOKEN)
    await bot.mention(f"<@UBOT> A 2023 study ({TOKEN}) found remote work helps.", user="U1")

    question = rid_of(fake, await bot.command("forget-me", user="U1"))
    cancelled = await press(bot, fake.press_button(question, "Cancel", user="U1", team="T1"))
    await fake.wait_for(lambda: fake.responses.get(cancelled), what="the cancel")
    assert fake.responses[cancelled][0]["text"] == CANCELLED
    assert fake.responses[cancelled][0]["replace_original"] is True

    bot.adapter.confirm_timeout = 0.0
    question = rid_of(fake, await bot.command("forget-me", user="U1"))
    late = await press(bot, fake.press_button(question, "Confirm", user="U1", team="T1"))
    await fake.wait_for(lambda: fake.responses.get(late), what="the expiry")
    assert fake.responses[late][0]["text"] == expired_text("forget-me")
    await fake.settle()
    assert len(fake.responses[late]) == 1
    assert TOKEN in json.dumps(await export(bot, "U1"))
