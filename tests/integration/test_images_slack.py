"""Images on Slack, end to end: real Bolt + slack_sdk ↔ fake Slack (serving shared files
at `url_private`), real runtime, real anthropic / openai SDK ↔ their fakes.

A file shared with an @mention (or in a DM) is downloaded with the bot token, from
Slack's file host only, and reaches the reply model as an image block. A workspace
whose app lacks `files:read` (made from an older manifest) gets Slack's redirect to the
sign-in page, which the bot does not follow: the member is told, the words answered.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.fakes.images import picture
from tests.fakes.slack_server import OLD_MANIFEST_SCOPES, FakeSlack, Identity
from tests.integration.conftest import LLMFake, chat_requests, ess_requests, make_settings
from tests.integration.test_slack_e2e import SlackBot, slack_bot
from tests.slack.conftest import (  # noqa: F401  (fixtures "fake", "http")
    BOT_TOKEN,
    dm_event,
    fake_slack,
    http_session,
    mention_event,
    slack_values,
)

OpenBot = Callable[..., contextlib.AbstractAsyncContextManager[SlackBot]]


@pytest.fixture
def open_bot(tmp_path: Path, llm: Any, fake: FakeSlack, http: aiohttp.ClientSession) -> OpenBot:
    """The bot on the fake Slack, with these settings over the tests' own."""

    @contextlib.asynccontextmanager
    async def opened(**overrides: Any) -> AsyncIterator[SlackBot]:
        # The workspace the events come from (T1) is the bot token's, as downloads need.
        fake.identities.setdefault(BOT_TOKEN, Identity(team_id="T1"))
        values = slack_values(fake, **{"SLACK_ALLOW_DMS": False, **overrides})
        settings = make_settings(tmp_path / "data", llm=llm, **values)
        async with slack_bot(settings, llm, fake, http) as bot:
            yield bot

    return opened


async def deliver(bot: SlackBot, body: dict[str, Any]) -> dict[str, Any]:
    """Deliver an event, wait for the bot's answer in its thread and for the learning."""
    before = len(bot.fake.posts())
    status, _ = await bot.deliver(body)
    assert status == 200
    await bot.fake.wait_for(lambda: len(bot.fake.posts()) > before, what="the reply")
    await bot.runtime.drain()
    [reply] = bot.fake.posts()[before:]
    return reply


def mention_with(bot: SlackBot, text: str, files: list[dict[str, Any]]) -> dict[str, Any]:
    ts = bot.next_ts()
    return mention_event(event_id=f"Ev{ts}", team="T1", ts=ts, text=text, files=files)


async def test_a_shared_picture_reaches_the_reply_model_with_the_bot_token(
    open_bot: OpenBot,
    llm_server: LLMFake,
    fake: FakeSlack,
) -> None:
    async with open_bot() as bot:
        jpeg = picture("image/jpeg")
        shared = fake.share_file("IMG_0001.jpg", jpeg, mimetype="image/jpeg", team="T1")
        reply = await deliver(bot, mention_with(bot, "<@UBOT> what is this?", [shared]))
        assert reply["text"].startswith("[reply] what is this?")
        [chat] = chat_requests(llm_server)
        assert chat.images == [("image/jpeg", jpeg)]
        [download] = fake.file_requests
        assert download.token == BOT_TOKEN
        assert download.path.endswith("/download/IMG_0001.jpg")
        [ess] = ess_requests(llm_server)
        assert ess.images == [] and "shared" not in ess.user_text


async def test_a_picture_in_a_dm_is_read_too(
    open_bot: OpenBot,
    anthropic_server: LLMFake,
    fake: FakeSlack,
) -> None:
    """A DM with only a file: Slack's `file_share` message, no words."""
    async with open_bot(SLACK_ALLOW_DMS=True) as bot:
        gif = picture("image/gif")
        shared = fake.share_file("wave.gif", gif, mimetype="image/gif", team="T1")
        body = dm_event(event_id="EvDM1", text="", subtype="file_share", files=[shared])
        reply = await deliver(bot, body)
        assert reply["text"].startswith("[reply] [shared 1 image]")
        assert [r.images for r in chat_requests(anthropic_server)] == [[("image/gif", gif)]]
        assert ess_requests(anthropic_server) == []  # no words: nothing to rate


async def test_without_files_read_the_sign_in_redirect_is_not_followed(
    open_bot: OpenBot,
    anthropic_server: LLMFake,
    fake: FakeSlack,
) -> None:
    """An app made from the old manifest has no `files:read`: Slack answers the download
    with a redirect to its sign-in page. The member is told; the words are answered."""
    fake.identities[BOT_TOKEN] = Identity(team_id="T1", scopes=OLD_MANIFEST_SCOPES)
    async with open_bot() as bot:
        shared = fake.share_file("cat.png", picture(), team="T1")
        reply = await deliver(bot, mention_with(bot, "<@UBOT> and this?", [shared]))
        assert reply["text"].startswith("[reply] and this?")
        assert "I couldn't fetch cat.png" in reply["text"]
        [download] = fake.file_requests
        assert shared["url_private_download"].endswith(download.path)
        assert [r.images for r in chat_requests(anthropic_server)] == [[]]


@pytest.mark.parametrize(
    ("name", "mimetype", "served", "note"),
    [
        ("report.pdf", "application/pdf", None, "report.pdf is not an image I can look at"),
        ("page.png", "image/png", "text/html", "page.png is not an image I can look at"),
    ],
)
async def test_a_file_that_is_no_picture_is_refused_without_a_crash(
    open_bot: OpenBot,
    anthropic_server: LLMFake,
    fake: FakeSlack,
    name: str,
    mimetype: str,
    served: str | None,
    note: str,
) -> None:
    async with open_bot() as bot:
        shared = fake.share_file(
            name, b"%PDF-1.7", mimetype=mimetype, served_type=served, team="T1"
        )
        reply = await deliver(bot, mention_with(bot, "<@UBOT> thoughts?", [shared]))
        assert reply["text"].startswith("[reply] thoughts?") and note in reply["text"]
        assert [r.images for r in chat_requests(anthropic_server)] == [[]]
        # Slack's label was enough for the PDF; the page was fetched and refused.
        assert len(fake.file_requests) == (1 if served else 0)


async def test_a_streamed_reply_ends_with_the_note(
    open_bot: OpenBot, anthropic_server: LLMFake, fake: FakeSlack
) -> None:
    """Where the workspace streams replies, the note about a file comes at the end of
    the streamed message, after the answer."""
    fake.streaming = True
    async with open_bot() as bot:
        files = [
            fake.share_file("a.png", picture(), team="T1"),
            fake.share_file("b.pdf", b"%PDF", mimetype="application/pdf", team="T1"),
        ]
        status, _ = await bot.deliver(mention_with(bot, "<@UBOT> both?", files))
        assert status == 200
        await fake.wait_for(
            lambda: [s for s in fake.streams.values() if s["stopped"]], what="the stream's end"
        )
        [stream] = fake.streams.values()
        assert stream["text"].startswith("[reply] both?")
        assert stream["text"].endswith(
            "(b.pdf is not an image I can look at (PNG, JPEG, GIF or WebP).)"
        )
        assert fake.posts() == []
        assert [len(r.images) for r in chat_requests(anthropic_server)] == [1]
