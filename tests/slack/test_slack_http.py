"""Slack adapter in HTTP mode: signed requests in, Web API calls out, all on loopback."""

from __future__ import annotations

import asyncio
import logging
import re
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from slack_bolt.context.async_context import AsyncBoltContext

from adapters.slack import (
    MESSAGE_LIMIT,
    SlackAdapter,
    _team_of,
    from_slack_text,
    to_mrkdwn,
)
from bot.interface import StartupError
from bot.messages import Reply
from storage import Database
from tests.fakes.recording_runtime import RecordingRuntime
from tests.fakes.slack_server import FakeSlack, OAuthGrant, post_signed
from tests.slack.conftest import (
    SECRET,
    MemoryStore,
    adapter_for,
    adapter_url,
    command_form,
    dm_event,
    mention_event,
    running,
)


async def send(
    http: aiohttp.ClientSession, adapter: SlackAdapter, body: dict[str, Any], **kw: Any
) -> tuple[int, str, float]:
    return await post_signed(
        http, adapter_url(adapter), kw.pop("secret", SECRET), json_body=body, **kw
    )


async def test_mention_acked_fast_then_one_threaded_reply(
    fake: FakeSlack, runtime: RecordingRuntime, store: MemoryStore, http: aiohttp.ClientSession
) -> None:
    runtime.gate = asyncio.Event()  # the "LLM" stays busy until the HTTP ack is in
    async with running(adapter_for(fake, runtime, store)) as adapter:
        status, _, took = await send(
            http, adapter, mention_event(text="<@UBOT> hello <@U2>, see <https://a.b|this>")
        )
        assert status == 200
        assert took < 3.0
        await fake.wait_for(lambda: runtime.messages, what="runtime call")
        assert not fake.posts(), "reply must wait for the runtime, the ack must not"
        runtime.gate.set()
        await fake.wait_for(fake.posts, what="reply")
        await fake.settle()

    [post] = fake.posts()
    assert post["channel"] == "C0001"
    assert post["thread_ts"] == "1700000000.000100"
    assert post["text"] == "echo: hello @Bob, see this (https://a.b)"
    [msg] = runtime.messages
    assert msg.community.id == "slack:T0001"
    assert msg.text == "hello @Bob, see this (https://a.b)"
    assert msg.user.id == "U1" and msg.user.name == "Alice"
    assert msg.channel_id == "C0001" and msg.addressed
    assert fake.calls("chat.postMessage")[0].token == "xoxb-test-token"


async def test_reply_goes_into_existing_thread(
    fake: FakeSlack, runtime: RecordingRuntime, store: MemoryStore, http: aiohttp.ClientSession
) -> None:
    async with running(adapter_for(fake, runtime, store)) as adapter:
        body = mention_event(ts="1700000050.000200", thread_ts="1700000000.000100")
        assert (await send(http, adapter, body))[0] == 200
        await fake.wait_for(fake.posts, what="reply")
    assert fake.posts()[0]["thread_ts"] == "1700000000.000100"
    assert runtime.messages[0].thread_id == "1700000000.000100"


async def test_bad_signature_and_stale_timestamp_are_401(
    fake: FakeSlack, runtime: RecordingRuntime, store: MemoryStore, http: aiohttp.ClientSession
) -> None:
    async with running(adapter_for(fake, runtime, store)) as adapter:
        wrong_secret = await send(http, adapter, mention_event(event_id="E1"), secret="nope")
        tampered = await send(http, adapter, mention_event(event_id="E2"), tamper=True)
        stale = await send(
            http, adapter, mention_event(event_id="E3"), timestamp=int(time.time()) - 6 * 60
        )
        await fake.settle()
    assert [wrong_secret[0], tampered[0], stale[0]] == [401, 401, 401]
    assert runtime.messages == []
    assert fake.posts() == []
    assert store.seen == {}, "unverified requests must not reach dedup storage"


async def test_url_verification_echoes_challenge(
    fake: FakeSlack, runtime: RecordingRuntime, store: MemoryStore, http: aiohttp.ClientSession
) -> None:
    body = {"token": "x", "challenge": "3eZbrw1aBm2rZgRNFdxV2595E9CY3gmdALWMmHkvFXO7tYXAYM8P"}
    body["type"] = "url_verification"
    async with running(adapter_for(fake, runtime, store)) as adapter:
        status, text, _ = await send(http, adapter, body)
    assert status == 200
    assert "3eZbrw1aBm2rZgRNFdxV2595E9CY3gmdALWMmHkvFXO7tYXAYM8P" in text


async def test_retried_event_answers_once_also_after_restart(
    fake: FakeSlack, runtime: RecordingRuntime, store: MemoryStore, http: aiohttp.ClientSession
) -> None:
    event = mention_event(event_id="EvRetry")
    async with running(adapter_for(fake, runtime, store)) as adapter:
        assert (await send(http, adapter, event))[0] == 200
        assert (await send(http, adapter, event, retry_num=1))[0] == 200
        await fake.wait_for(fake.posts, what="reply")
        await fake.settle()
    assert len(fake.posts()) == 1

    # A new adapter on the same storage: the restarted process.
    async with running(adapter_for(fake, runtime, store)) as adapter:
        assert (await send(http, adapter, event, retry_num=2))[0] == 200
        await fake.settle()
        assert len(fake.posts()) == 1
        assert (await send(http, adapter, mention_event(event_id="EvNew")))[0] == 200
        await fake.wait_for(lambda: len(fake.posts()) == 2, what="reply to the new event")
    assert len(runtime.messages) == 2


async def test_slash_beliefs_acks_fast_and_answers_via_response_url(
    fake: FakeSlack, runtime: RecordingRuntime, store: MemoryStore, http: aiohttp.ClientSession
) -> None:
    async with running(adapter_for(fake, runtime, store)) as adapter:
        status, text, took = await post_signed(
            http, adapter_url(adapter), SECRET, form=command_form(fake, "beliefs open source")
        )
        assert status == 200 and took < 3.0
        assert text == ""
        await fake.wait_for(lambda: fake.responses.get("r1"), what="response_url post")
        await fake.settle()
    [answer] = fake.responses["r1"]
    assert answer["response_type"] == "ephemeral"
    assert answer["text"] == "*Beliefs*\nbeliefs done: open source"
    [request] = runtime.commands
    assert request.name == "beliefs" and request.args == ("open source",)
    assert request.community.id == "slack:T0001"
    assert request.caller.id == "U1"
    assert request.is_moderator is False


async def test_non_moderator_rollback_is_refused_privately(
    fake: FakeSlack, runtime: RecordingRuntime, store: MemoryStore, http: aiohttp.ClientSession
) -> None:
    async with running(adapter_for(fake, runtime, store)) as adapter:
        form = command_form(fake, "rollback 2", user="U2")
        assert (await post_signed(http, adapter_url(adapter), SECRET, form=form))[0] == 200
        await fake.wait_for(lambda: fake.responses.get("r1"), what="refusal")
    [request] = runtime.commands
    assert request.is_moderator is False and request.args == ("2",)
    [answer] = fake.responses["r1"]
    assert answer["response_type"] == "ephemeral"
    assert "Only moderators" in answer["text"]
    assert [c.args["user"] for c in fake.calls("users.info")] == ["U2"]
    assert request.caller.name == "Bob"


@pytest.mark.parametrize(
    ("user", "moderator_ids"),
    [("U2", "U9, U2"), ("UADMIN", ""), ("UOWNER", "")],
    ids=["SLACK_MODERATOR_IDS", "workspace-admin", "primary-owner"],
)
async def test_moderators_may_roll_back_and_it_is_announced(
    fake: FakeSlack,
    runtime: RecordingRuntime,
    store: MemoryStore,
    http: aiohttp.ClientSession,
    user: str,
    moderator_ids: str,
) -> None:
    adapter = adapter_for(fake, runtime, store, SLACK_MODERATOR_IDS=moderator_ids)
    async with running(adapter):
        form = command_form(fake, "rollback 2", user=user)
        assert (await post_signed(http, adapter_url(adapter), SECRET, form=form))[0] == 200
        await fake.wait_for(lambda: fake.responses.get("r1"), what="rollback answer")
    assert runtime.commands[0].is_moderator is True
    assert fake.responses["r1"][0]["response_type"] == "in_channel"


@pytest.mark.parametrize(
    ("text", "name", "args"),
    [
        ("usage 30", "usage", ("30",)),
        ("budget", "budget", ()),
        ("budget 2.50", "budget", ("2.50",)),
    ],
)
async def test_usage_and_budget_reach_the_runtime(
    fake: FakeSlack,
    runtime: RecordingRuntime,
    store: MemoryStore,
    http: aiohttp.ClientSession,
    text: str,
    name: str,
    args: tuple[str, ...],
) -> None:
    async with running(adapter_for(fake, runtime, store)) as adapter:
        form = command_form(fake, text)
        assert (await post_signed(http, adapter_url(adapter), SECRET, form=form))[0] == 200
        await fake.wait_for(lambda: fake.responses.get("r1"), what="answer")
    [request] = runtime.commands
    assert (request.name, request.args) == (name, args)


async def test_unknown_subcommand_gets_private_help(
    fake: FakeSlack, runtime: RecordingRuntime, store: MemoryStore, http: aiohttp.ClientSession
) -> None:
    async with running(adapter_for(fake, runtime, store)) as adapter:
        form = command_form(fake, "dance now")
        assert (await post_signed(http, adapter_url(adapter), SECRET, form=form))[0] == 200
        await fake.wait_for(lambda: fake.responses.get("r1"), what="answer")
    assert runtime.commands == []
    answer = fake.responses["r1"][0]
    assert answer["response_type"] == "ephemeral" and "/sonality help" in answer["text"]


async def test_two_team_ids_are_two_communities(
    fake: FakeSlack, runtime: RecordingRuntime, store: MemoryStore, http: aiohttp.ClientSession
) -> None:
    # One token serving two workspaces of an Enterprise Grid org.
    async with running(adapter_for(fake, runtime, store)) as adapter:
        await send(http, adapter, mention_event(event_id="Ea", team="T0001"))
        await send(http, adapter, mention_event(event_id="Eb", team="T0002", channel="C0002"))
        await fake.wait_for(lambda: len(fake.posts()) == 2, what="two replies")
    assert {m.community.id for m in runtime.messages} == {"slack:T0001", "slack:T0002"}
    assert {p["channel"] for p in fake.posts()} == {"C0001", "C0002"}


async def test_bot_messages_are_ignored_and_dms_answered(
    fake: FakeSlack, runtime: RecordingRuntime, store: MemoryStore, http: aiohttp.ClientSession
) -> None:
    async with running(adapter_for(fake, runtime, store)) as adapter:
        await send(http, adapter, mention_event(event_id="B1", bot_id="B0THER"))
        await send(http, adapter, dm_event(event_id="B2", subtype="bot_message", bot_id="B9"))
        await send(http, adapter, dm_event(event_id="B3", subtype="bot_message"))
        await send(http, adapter, dm_event(event_id="B4", user="UBOT"))
        await send(http, adapter, dm_event(event_id="B5", subtype="message_changed"))
        await send(http, adapter, mention_event(event_id="B6", channel="D0001"))
        await fake.settle()
        assert runtime.messages == [] and fake.posts() == []
        await send(http, adapter, dm_event(event_id="H1", text="psst"))
        await fake.wait_for(fake.posts, what="DM reply")
    [msg] = runtime.messages
    assert msg.text == "psst" and msg.channel_id == "D0001" and msg.thread_id is None
    [post] = fake.posts()
    assert post["channel"] == "D0001" and post.get("thread_ts") is None


async def test_dms_ignored_unless_allowed(
    fake: FakeSlack, runtime: RecordingRuntime, store: MemoryStore, http: aiohttp.ClientSession
) -> None:
    async with running(adapter_for(fake, runtime, store, SLACK_ALLOW_DMS=False)) as adapter:
        assert (await send(http, adapter, dm_event(event_id="D1")))[0] == 200
        await fake.settle()
    assert runtime.messages == [] and fake.posts() == []


async def test_long_answer_split_with_balanced_fences(
    fake: FakeSlack, runtime: RecordingRuntime, store: MemoryStore, http: aiohttp.ClientSession
) -> None:
    code = "\n".join(f"x_{i} = {i} ** 2  # squares" for i in range(300))
    prose = " ".join(["**Careful** reasoning matters."] * 150)
    answer = f"{prose}\n\n```python\n{code}\n```\n\n{prose}"
    runtime.answer = lambda m: Reply(text=answer)
    async with running(adapter_for(fake, runtime, store)) as adapter:
        await send(http, adapter, mention_event())
        await fake.wait_for(lambda: len(fake.posts()) >= 4, what="chunks")
        await fake.settle()
    posts = fake.posts()
    assert len(posts) >= 4
    for post in posts:
        assert len(post["text"]) <= MESSAGE_LIMIT
        assert post["text"].count("```") % 2 == 0
        assert post["thread_ts"] == "1700000000.000100"
    joined = "\n".join(p["text"] for p in posts)
    assert "```python" not in joined, "Slack would print the language tag"
    assert "x_299 = 299 ** 2" in joined, "code inside fences is left alone"
    assert "*Careful* reasoning" in joined and "**Careful**" not in joined


async def test_reaction_added_then_removed(
    fake: FakeSlack, runtime: RecordingRuntime, store: MemoryStore, http: aiohttp.ClientSession
) -> None:
    async with running(adapter_for(fake, runtime, store)) as adapter:
        await send(http, adapter, mention_event())
        await fake.wait_for(lambda: fake.calls("reactions.remove"), what="reaction removed")
    order = [
        r.api_method
        for r in fake.requests
        if r.api_method in {"reactions.add", "chat.postMessage", "reactions.remove"}
    ]
    assert order == ["reactions.add", "chat.postMessage", "reactions.remove"]
    add = fake.calls("reactions.add")[0].args
    expected = {"channel": "C0001", "timestamp": "1700000000.000100", "name": "thinking_face"}
    assert expected.items() <= add.items()
    assert fake.reactions == set()


async def test_slack_api_errors_are_logged_not_fatal(
    fake: FakeSlack,
    runtime: RecordingRuntime,
    store: MemoryStore,
    http: aiohttp.ClientSession,
    caplog: pytest.LogCaptureFixture,
) -> None:
    fake.failures.update(
        {"chat.postMessage": "channel_not_found", "reactions.add": "missing_scope"}
    )
    caplog.set_level(logging.WARNING, logger="adapters.slack")
    async with running(adapter_for(fake, runtime, store)) as adapter:
        await send(http, adapter, mention_event(event_id="F1", channel="CGONE"))
        await fake.wait_for(lambda: fake.calls("reactions.remove"), what="attempt finished")
        fake.failures.clear()
        await send(http, adapter, mention_event(event_id="F2"))
        await fake.wait_for(lambda: len(fake.calls("chat.postMessage")) == 2, what="2nd reply")
    failures = [r.getMessage() for r in caplog.records if "channel_not_found" in r.getMessage()]
    assert failures and "team=T0001" in failures[0] and "channel=CGONE" in failures[0]


@pytest.mark.filterwarnings("ignore:BasicAuth is deprecated:DeprecationWarning")
async def test_oauth_install_then_events_use_that_workspace_token(
    fake: FakeSlack, runtime: RecordingRuntime, store: MemoryStore, http: aiohttp.ClientSession
) -> None:
    fake.grants["code-123"] = OAuthGrant(team_id="T0009", bot_token="xoxb-T0009")
    adapter = adapter_for(
        fake,
        runtime,
        store,
        SLACK_BOT_TOKEN=None,
        SLACK_CLIENT_ID="111.222",
        SLACK_CLIENT_SECRET="shh",
    )
    async with running(adapter):
        async with http.get(adapter_url(adapter, "/slack/install")) as resp:
            assert resp.status == 200
            page = await resp.text()
            cookie = resp.headers["Set-Cookie"].split(";", 1)[0]
        state = re.search(r"state=([\w\-]+)", page)
        assert state is not None
        assert "scope=app_mentions:read,chat:write," in page
        redirect = adapter_url(
            adapter, f"/slack/oauth_redirect?code=code-123&state={state.group(1)}"
        )
        async with http.get(redirect, headers={"Cookie": cookie}) as resp:
            assert resp.status == 200, await resp.text()
        assert store.installations and store.installations[0][0]["team_id"] == "T0009"
        assert store.states == {}, "the state is single-use"

        await send(http, adapter, mention_event(event_id="O1", team="T0009"))
        await fake.wait_for(fake.posts, what="reply in the installed workspace")
        await send(http, adapter, mention_event(event_id="O2", team="T0404"))
        await fake.settle()
    [post] = fake.calls("chat.postMessage")
    assert post.token == "xoxb-T0009"
    assert [m.community.id for m in runtime.messages] == ["slack:T0009"]


async def test_misconfiguration_is_a_startup_error(
    fake: FakeSlack, runtime: RecordingRuntime, store: MemoryStore
) -> None:
    with pytest.raises(StartupError, match="SLACK_SIGNING_SECRET"):
        adapter_for(fake, runtime, store, SLACK_SIGNING_SECRET=None)
    with pytest.raises(StartupError, match="SLACK_BOT_TOKEN"):
        adapter_for(fake, runtime, store, SLACK_BOT_TOKEN=None)
    adapter = adapter_for(fake, runtime, store, SLACK_BOT_TOKEN="xoxp-not-a-bot")
    with pytest.raises(StartupError, match="invalid_auth"):
        async with running(adapter):
            pass


def test_markdown_to_mrkdwn() -> None:
    md = (
        "# Title\n**bold** and *it* and ~~gone~~, [site](https://x.y/?a=1&b=2)\n"
        "- item\n> quoted\n`a<b`\n```py\nif a < b and **c**:\n```"
    )
    assert to_mrkdwn(md) == (
        "*Title*\n*bold* and _it_ and ~gone~, site (<https://x.y/?a=1&amp;b=2>)\n"
        "• item\n> quoted\n`a&lt;b`\n```\nif a &lt; b and **c**:\n```"
    )


def test_a_masked_link_is_shown_with_its_address() -> None:
    """The model may repeat a member's link under words of theirs: Slack would show only
    the words, so the address is shown beside them."""
    md = "See [the moderators' notice](https://evil.example/login) or [x](mailto:a@b.c)."
    assert to_mrkdwn(md) == (
        "See the moderators' notice (<https://evil.example/login>) or x (<mailto:a@b.c>)."
    )
    assert to_mrkdwn("[https://a.b/c](https://a.b/c)") == "<https://a.b/c>"


def test_slack_text_to_plain() -> None:
    raw = "<@UBOT> ask <@U2> in <#C1|general> about <https://e.x|docs> &amp; <!here> &lt;3"
    assert from_slack_text(raw, "UBOT", {"U2": "Bob"}) == (
        "ask @Bob in #general about docs (https://e.x) & @here <3"
    )


def test_team_is_the_workspace_not_the_author_or_org() -> None:
    shared = mention_event(team="T0001")
    shared["event"]["team"] = "TEXTERNAL"  # author from another org in a shared channel
    assert _team_of(shared, AsyncBoltContext()) == "T0001"
    org_wide = mention_event(team="T0002")
    org_wide["team_id"] = "E0001"
    org_wide["context_team_id"] = "T0002"
    assert _team_of(org_wide, AsyncBoltContext()) == "T0002"


@pytest.mark.filterwarnings("ignore:BasicAuth is deprecated:DeprecationWarning")
async def test_with_the_real_database_install_and_dedup_survive_a_restart(
    fake: FakeSlack,
    runtime: RecordingRuntime,
    http: aiohttp.ClientSession,
    tmp_path: Path,
) -> None:
    """The same flows on `storage.Database` (SQLite): what production plugs in."""
    fake.grants["code-9"] = OAuthGrant(team_id="T0009", bot_token="xoxb-T0009")
    oauth = {"SLACK_BOT_TOKEN": None, "SLACK_CLIENT_ID": "1.2", "SLACK_CLIENT_SECRET": "s"}
    event = mention_event(event_id="EvDb", team="T0009")
    db = await Database.open(tmp_path / "sonality.sqlite3")
    try:
        adapter = adapter_for(fake, runtime, db, **oauth)
        async with running(adapter):
            async with http.get(adapter_url(adapter, "/slack/install")) as resp:
                cookie = resp.headers["Set-Cookie"].split(";", 1)[0]
                state = re.search(r"state=([\w\-]+)", await resp.text())
            assert state is not None
            redirect = adapter_url(
                adapter, f"/slack/oauth_redirect?code=code-9&state={state.group(1)}"
            )
            async with http.get(redirect, headers={"Cookie": cookie}) as resp:
                assert resp.status == 200
            async with http.get(redirect, headers={"Cookie": cookie}) as resp:
                assert resp.status != 200, "an OAuth state works once"
            assert (await send(http, adapter, event))[0] == 200
            await fake.wait_for(fake.posts, what="reply")
    finally:
        await db.close()

    db = await Database.open(tmp_path / "sonality.sqlite3")  # restarted process
    try:
        adapter = adapter_for(fake, runtime, db, **oauth)
        async with running(adapter):
            assert (await send(http, adapter, event, retry_num=1))[0] == 200
            assert (await send(http, adapter, mention_event(event_id="Ev2", team="T0009")))[
                0
            ] == 200
            await fake.wait_for(lambda: len(fake.posts()) == 2, what="second reply")
            await fake.settle()
    finally:
        await db.close()
    assert len(fake.posts()) == 2
    assert {c.token for c in fake.calls("chat.postMessage")} == {"xoxb-T0009"}
