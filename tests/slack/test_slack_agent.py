"""Slack's agent surface (issue 25) with real slack-bolt / slack-sdk against the fake
Slack: the manifest's agent-view fields, suggested prompts when a member opens the
bot's Messages tab, feedback buttons under streamed replies and a press recorded, and
the fake holding the new methods to Slack's rules. An app created from the old
manifest (no `assistant:write`) gets none of it and keeps working as before.

The real runtime, storage and `/sonality status` are in
tests/integration/test_slack_agent_e2e.py.
"""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml  # installed with chromadb
from slack_sdk.errors import SlackApiError
from slack_sdk.web.async_client import AsyncWebClient

from adapters.confirm_text import WORKING
from adapters.slack import BOT_SCOPES
from adapters.slack_agent import AGENT_SCOPE, PROMPTS_TITLE, SUGGESTED_PROMPTS, feedback_blocks
from bot.commands import HELP
from bot.messages import CommandRequest, CommandResult, IncomingMessage, Reply, ReplyKind
from sonality.llm import TextSink
from tests.fakes.recording_runtime import RecordingRuntime
from tests.fakes.slack_server import (
    OLD_MANIFEST_SCOPES,
    FakeSlack,
    Identity,
    block_errors,
    interaction_form,
    post_signed,
)
from tests.slack.conftest import (
    BOT_TOKEN,
    SECRET,
    MemoryStore,
    adapter_for,
    adapter_url,
    app_home_opened_event,
    command_form,
    dm_event,
    mention_event,
    running,
)
from tests.slack.test_slack_socket import socket_adapter

TITLES = [
    "What do you believe about…?",
    "How did your views change this week?",
    "What would change your mind?",
]


def test_manifest_declares_the_agent_view_as_the_adapter_uses_it() -> None:
    """`agent_view` with its description, the `assistant:write` scope (also what the
    OAuth install asks for), interactivity for the buttons, `app_home_opened` for the
    suggested prompts, and a usage hint naming every command of `/sonality help`."""
    manifest = yaml.safe_load((Path(__file__).parents[2] / "slack" / "manifest.yml").read_text())
    features, settings = manifest["features"], manifest["settings"]
    description = features["agent_view"]["agent_description"]
    assert isinstance(description, str) and len(description.strip()) >= 20
    assert "assistant_view" not in features  # closed to new apps: agent_view replaces it
    scopes = tuple(manifest["oauth_config"]["scopes"]["bot"])
    assert scopes == BOT_SCOPES and AGENT_SCOPE in scopes
    assert settings["interactivity"]["is_enabled"] is True
    assert set(settings["event_subscriptions"]["bot_events"]) == {
        "app_mention",
        "message.im",
        "message.channels",
        "message.groups",
        "app_uninstalled",
        "tokens_revoked",
        "app_home_opened",
    }
    assert features["app_home"]["messages_tab_enabled"] is True
    [command] = features["slash_commands"]
    assert command["command"] == "/sonality"
    hinted = {part.split()[0] for part in command["usage_hint"].split(" | ")}
    helped = {line.split()[1] for line in HELP.splitlines() if line.startswith("/sonality ")}
    assert len(helped) >= 10 and hinted == helped, hinted ^ helped
    assert len(command["usage_hint"]) <= 1000  # Slack's limit
    assert settings["socket_mode_enabled"] is True
    assert settings["org_deploy_enabled"] is False


# --------------------------------------------------------------------------- prompts


async def _open_tab(
    fake: FakeSlack, http: aiohttp.ClientSession, adapter: Any, tab: str, event_id: str
) -> str:
    channel = fake.dm_with("U1")
    body = app_home_opened_event(
        team="T0001", user="U1", channel=channel, tab=tab, event_id=event_id
    )
    status, _, _ = await post_signed(http, adapter_url(adapter), SECRET, json_body=body)
    assert status == 200
    return channel


async def test_opening_the_messages_tab_offers_the_prompts_the_home_tab_none(
    fake: FakeSlack, runtime: RecordingRuntime, store: MemoryStore, http: aiohttp.ClientSession
) -> None:
    async with running(adapter_for(fake, runtime, store)) as adapter:
        await _open_tab(fake, http, adapter, "home", "EvHome1")
        await fake.settle()
        assert fake.calls("assistant.threads.setSuggestedPrompts") == []
        channel = await _open_tab(fake, http, adapter, "messages", "EvMsgs1")
        await fake.wait_for(lambda: fake.suggested_prompts, what="suggested prompts")
    [shown] = fake.suggested_prompts
    assert shown["channel"] == channel and shown["title"] == PROMPTS_TITLE
    assert [p["title"] for p in shown["prompts"]] == TITLES
    assert all(p["message"].endswith("?") for p in shown["prompts"])
    # An agent-view app sets prompts on the DM itself: naming a thread would do nothing.
    assert "thread_ts" not in fake.calls("assistant.threads.setSuggestedPrompts")[0].args


@pytest.mark.parametrize("case", ["old manifest", "DMs not answered"])
async def test_no_prompts_without_the_agent_surface_or_dms(
    case: str,
    fake: FakeSlack,
    runtime: RecordingRuntime,
    store: MemoryStore,
    http: aiohttp.ClientSession,
) -> None:
    if case == "old manifest":
        fake.default_identity = Identity(scopes=OLD_MANIFEST_SCOPES)
    allow_dms = case != "DMs not answered"
    async with running(adapter_for(fake, runtime, store, SLACK_ALLOW_DMS=allow_dms)) as adapter:
        await _open_tab(fake, http, adapter, "messages", "EvMsgs2")
        await fake.settle()
    assert fake.calls("auth.test")  # the event did reach the bot
    assert fake.calls("assistant.threads.setSuggestedPrompts") == []


async def test_the_fake_holds_suggested_prompts_to_slacks_rules(fake: FakeSlack) -> None:
    dm = fake.dm_with("U1")
    prompts = [dict(p) for p in SUGGESTED_PROMPTS]

    async def error_of(token: str, **kw: Any) -> dict[str, Any]:
        client = AsyncWebClient(token=token, base_url=fake.base_url)
        with pytest.raises(SlackApiError) as raised:
            await client.assistant_threads_setSuggestedPrompts(**kw)
        return dict(raised.value.response.data)

    fake.identities["xoxb-old"] = Identity(scopes=OLD_MANIFEST_SCOPES)
    missing = await error_of("xoxb-old", channel_id=dm, prompts=prompts)
    assert missing == {
        "ok": False,
        "error": "missing_scope",
        "needed": "assistant:write",
        "provided": ",".join(OLD_MANIFEST_SCOPES),
    }
    assert (await error_of(BOT_TOKEN, channel_id="C0001", prompts=prompts))[
        "error"
    ] == "channel_not_found"
    assert (await error_of(BOT_TOKEN, channel_id=dm, prompts=prompts * 2))[
        "error"
    ] == "invalid_arguments"
    assert (await error_of(BOT_TOKEN, channel_id=dm, prompts=[{"title": "x"}]))[
        "error"
    ] == "invalid_arguments"
    assert (await error_of("xoxp-nobody", channel_id=dm, prompts=prompts))["error"] == (
        "invalid_auth"
    )
    client = AsyncWebClient(token=BOT_TOKEN, base_url=fake.base_url)
    await client.assistant_threads_setSuggestedPrompts(
        channel_id=dm, thread_ts="1700000000.000100", prompts=prompts
    )
    assert fake.suggested_prompts == []  # accepted, and silently nothing (agent view)
    await client.assistant_threads_setSuggestedPrompts(channel_id=dm, prompts=prompts)
    assert len(fake.suggested_prompts) == 1


# --------------------------------------------------------------------------- feedback

ANSWER = ["Tides ", "follow ", "the ", "moon."]


def _streaming(runtime: RecordingRuntime, kind: ReplyKind = ReplyKind.ANSWER) -> None:
    async def stream(message: IncomingMessage, on_text: TextSink) -> Reply:
        for piece in ANSWER:
            await on_text(piece)
            await asyncio.sleep(0.05)
        return Reply(
            text="".join(ANSWER) if kind is ReplyKind.ANSWER else "(cut)", kind=kind, streamed=True
        )

    runtime.stream = stream


async def _streamed_reply(
    fake: FakeSlack, http: aiohttp.ClientSession, adapter: Any, body: dict[str, Any]
) -> str:
    status, _, _ = await post_signed(http, adapter_url(adapter), SECRET, json_body=body)
    assert status == 200
    await fake.wait_for(
        lambda: any(s["stopped"] for s in fake.streams.values()), what="the stream's end"
    )
    [(ts, _)] = fake.streams.items()
    return ts


def _reply(fake: FakeSlack, ts: str) -> str:
    """How a vote names the reply it is on: a ts names a message only in its channel."""
    return f"{fake.streams[ts]['channel']}:{ts}"


async def _press(
    http: aiohttp.ClientSession, adapter: Any, payload: dict[str, Any]
) -> tuple[int, float]:
    status, _, took = await post_signed(
        http, adapter_url(adapter), SECRET, form=interaction_form(payload)
    )
    return status, took


async def test_a_streamed_reply_ends_with_feedback_buttons_and_each_press_counts_once(
    fake: FakeSlack, runtime: RecordingRuntime, store: MemoryStore, http: aiohttp.ClientSession
) -> None:
    fake.streaming = True
    store.communities = {"slack:T0001"}
    _streaming(runtime)
    async with running(adapter_for(fake, runtime, store)) as adapter:
        ts = await _streamed_reply(fake, http, adapter, mention_event(text="<@UBOT> tides?"))
        [stream] = fake.streams.values()
        assert stream["text"] == "".join(ANSWER)
        [block] = stream["blocks"]
        assert block["type"] == "context_actions"
        assert block["elements"][0]["type"] == "feedback_buttons"

        status, took = await _press(http, adapter, fake.press_feedback(ts, user="U2"))
        assert status == 200 and took < 3.0
        await fake.wait_for(lambda: store.feedback, what="the vote")
        assert store.feedback == {("slack:T0001", _reply(fake, ts), "U2"): True}
        # Changing their mind replaces the vote; another member's is their own.
        await _press(http, adapter, fake.press_feedback(ts, user="U2", positive=False))
        await _press(http, adapter, fake.press_feedback(ts, user="U1"))
        await fake.wait_for(lambda: len(store.feedback) == 2, what="the second vote")
        await fake.settle()
    assert store.feedback == {
        ("slack:T0001", _reply(fake, ts), "U2"): False,
        ("slack:T0001", _reply(fake, ts), "U1"): True,
    }


async def test_feedback_in_a_dm_counts_for_the_members_own_personality(
    fake: FakeSlack, runtime: RecordingRuntime, store: MemoryStore, http: aiohttp.ClientSession
) -> None:
    fake.streaming = True
    dm_personality = "slack:T0001:dm:U1"
    store.communities = {dm_personality}
    _streaming(runtime)
    async with running(adapter_for(fake, runtime, store)) as adapter:
        body = dm_event(event_id="D1", text="tides?", thread_ts="1700000000.000050")
        ts = await _streamed_reply(fake, http, adapter, body)
        await _press(http, adapter, fake.press_feedback(ts, user="U1"))
        await fake.wait_for(lambda: store.feedback, what="the vote")
    assert store.feedback == {(dm_personality, _reply(fake, ts), "U1"): True}


async def test_no_buttons_on_a_broken_reply_or_from_an_old_manifest_app(
    fake: FakeSlack, runtime: RecordingRuntime, store: MemoryStore, http: aiohttp.ClientSession
) -> None:
    fake.streaming = True
    _streaming(runtime, kind=ReplyKind.NOTICE)  # the model broke off: nothing to rate
    async with running(adapter_for(fake, runtime, store)) as adapter:
        await _streamed_reply(fake, http, adapter, mention_event(text="<@UBOT> tides?"))
    [stream] = fake.streams.values()
    assert stream["blocks"] == [] and stream["text"].endswith("(cut)")

    fake.streams.clear()
    fake.default_identity = Identity(scopes=OLD_MANIFEST_SCOPES)
    _streaming(runtime)
    async with running(adapter_for(fake, runtime, store)) as adapter:
        await _streamed_reply(fake, http, adapter, mention_event(event_id="E2", text="<@UBOT> ?"))
    [stream] = fake.streams.values()
    assert stream["blocks"] == [] and stream["text"] == "".join(ANSWER)


async def test_a_press_where_no_data_is_kept_is_acked_and_records_nothing(
    fake: FakeSlack,
    runtime: RecordingRuntime,
    store: MemoryStore,
    http: aiohttp.ClientSession,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="adapters.slack")
    fake.streaming = True
    _streaming(runtime)
    async with running(adapter_for(fake, runtime, store)) as adapter:
        ts = await _streamed_reply(fake, http, adapter, mention_event(text="<@UBOT> tides?"))
        payload = fake.press_feedback(ts, user="U2")
        payload["actions"][0]["value"] = "not-ours"
        assert (await _press(http, adapter, payload))[0] == 200
        assert (await _press(http, adapter, fake.press_feedback(ts, user="U2")))[0] == 200
        await fake.settle()
    assert store.feedback == {}
    assert "without team, user, reply or known value" in caplog.text
    assert "no data kept for slack:T0001" in caplog.text


async def test_the_fake_refuses_blocks_slack_would_refuse(fake: FakeSlack) -> None:
    good = [b.to_dict() for b in feedback_blocks()]
    assert block_errors(good) == []
    long_label = [
        {
            "type": "actions",
            "elements": [
                {
                    "type": "button",
                    "action_id": "a",
                    "text": {"type": "plain_text", "text": "x" * 76},
                }
            ],
        }
    ]
    assert block_errors(long_label) == [
        "must be 1 to 75 characters [json-pointer:/blocks/0/elements/0/text/text]"
    ]
    twice = good + good
    assert any("used twice" in e for e in block_errors(twice))
    assert block_errors([{"type": "context_actions", "elements": []}])
    assert block_errors([{"type": "section", "text": {"type": "mrkdwn", "text": "x" * 3001}}])
    assert block_errors([{"type": "carousel"}])

    fake.streaming = True
    client = AsyncWebClient(token=BOT_TOKEN, base_url=fake.base_url)
    started = await client.chat_startStream(channel="D0001", thread_ts="1.2", markdown_text="hi")
    with pytest.raises(SlackApiError) as raised:
        await client.chat_stopStream(channel="D0001", ts=started["ts"], blocks=twice)
    assert raised.value.response["error"] == "invalid_blocks"
    assert raised.value.response["response_metadata"]["messages"]
    assert not fake.streams[started["ts"]]["stopped"]  # a refused stop changes nothing


async def test_the_fake_refuses_a_message_of_nothing_as_slack_does(fake: FakeSlack) -> None:
    """chat.postMessage with no text, blocks or attachments is Slack's `no_text`."""
    client = AsyncWebClient(token=BOT_TOKEN, base_url=fake.base_url)
    with pytest.raises(SlackApiError) as refused, pytest.warns(UserWarning, match="`text`"):
        await client.chat_postMessage(channel="C1", text="")
    assert refused.value.response["error"] == "no_text"
    block = [{"type": "section", "text": {"type": "mrkdwn", "text": "hi"}}]
    with pytest.warns(UserWarning, match="`text` argument is missing"):  # slack_sdk's advice
        assert (await client.chat_postMessage(channel="C1", blocks=block))["ok"]
    assert (await client.chat_postMessage(channel="C1", text="hi"))["ok"]


async def test_over_socket_mode_a_press_arrives_as_an_interactive_envelope(
    fake: FakeSlack, runtime: RecordingRuntime, store: MemoryStore
) -> None:
    """Socket Mode needs no interactivity Request URL: presses come over the socket."""
    fake.streaming = True
    store.communities = {"slack:T0001"}
    _streaming(runtime)
    async with running(socket_adapter(fake, runtime, store)):
        await fake.wait_for(lambda: fake.ws_connections == 1, what="websocket")
        await fake.push_envelope("events_api", mention_event(text="<@UBOT> tides?"))
        await fake.wait_for(
            lambda: any(s["stopped"] for s in fake.streams.values()), what="the stream's end"
        )
        [ts] = fake.streams
        env = await fake.push_envelope("interactive", fake.press_feedback(ts, user="U2"))
        assert (await fake.wait_for_ack(env))["envelope_id"] == env
        await fake.wait_for(lambda: store.feedback, what="the vote")
    assert store.feedback == {("slack:T0001", _reply(fake, ts), "U2"): True}


# --------------------------------------------------------------------------- Confirm / Cancel


def _asking(runtime: RecordingRuntime, answer: str = "Forgotten.") -> None:
    """forget-me asks first; with `confirm` it answers `answer`."""

    def result(request: CommandRequest) -> CommandResult:
        if request.name == "forget-me" and request.args != ("confirm",):
            return CommandResult(
                text="Forget you? Type confirm.",
                button_text="Forget you? Press Confirm to go ahead.",
                confirm_args=("confirm",),
            )
        return CommandResult(text=answer, title=request.name)

    runtime.command_result = result


async def _question(
    fake: FakeSlack, http: aiohttp.ClientSession, adapter: Any, rid: str = "q1"
) -> str:
    form = command_form(fake, "forget-me", rid=rid)
    assert (await post_signed(http, adapter_url(adapter), SECRET, form=form))[0] == 200
    await fake.wait_for(lambda: fake.responses.get(rid), what="the question")
    return rid


async def test_a_long_confirmed_answer_fits_the_five_posts_of_its_response_url(
    fake: FakeSlack, runtime: RecordingRuntime, store: MemoryStore, http: aiohttp.ClientSession
) -> None:
    """The press's response_url takes five posts: "Working on it…" is one, so the
    answer gets four, the last one saying the output was cut."""
    _asking(runtime, answer="\n\n".join(f"{i} " + "x" * 3000 for i in range(8)))
    async with running(adapter_for(fake, runtime, store)) as adapter:
        question = await _question(fake, http, adapter)
        payload = fake.press_button(question, "Confirm", user="U1")
        assert (await _press(http, adapter, payload))[0] == 200
        pressed = str(payload["response_url"]).rsplit("/", 1)[1]
        await fake.wait_for(
            lambda: len(fake.responses.get(pressed, [])) + len(fake.refused_responses) >= 5,
            what="the answer",
        )
        await fake.settle()
    assert fake.refused_responses == []
    posted = fake.responses[pressed]
    assert len(posted) == 5 and posted[0]["text"] == WORKING
    assert posted[1]["replace_original"] is True
    assert posted[-1]["text"].endswith("_(output cut: too long for Slack)_")


async def test_the_fake_response_url_takes_five_posts(
    fake: FakeSlack, http: aiohttp.ClientSession
) -> None:
    statuses = []
    for i in range(6):
        async with http.post(fake.response_url("r5"), json={"text": str(i)}) as answer:
            statuses.append((answer.status, await answer.text()))
    assert statuses == [(200, "ok")] * 5 + [(404, "used_url")]
    assert [b["text"] for b in fake.responses["r5"]] == ["0", "1", "2", "3", "4"]


@pytest.mark.parametrize("forged", ["another workspace", "another member's DM", "no command"])
async def test_a_question_naming_another_personality_or_command_runs_nothing(
    forged: str,
    fake: FakeSlack,
    runtime: RecordingRuntime,
    store: MemoryStore,
    http: aiohttp.ClientSession,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A button's value comes back as the bot wrote it; should one ever arrive naming
    a personality of another workspace (or another member's DM), or a command that does
    not exist, the press answers nothing and runs nothing."""
    _asking(runtime)
    change = {
        "another workspace": {"community": "slack:T0002"},
        "another member's DM": {"community": "slack:T0001:dm:U2"},
        "no command": {"command": "drop-everything"},
    }[forged]
    async with running(adapter_for(fake, runtime, store)) as adapter:
        question = await _question(fake, http, adapter)
        payload = fake.press_button(question, "Confirm", user="U1")
        value = json.loads(payload["actions"][0]["value"])
        payload["actions"][0]["value"] = json.dumps({**value, **change})
        assert (await _press(http, adapter, payload))[0] == 200
        await fake.settle()
        # The real question still works: the forged press did not use it up.
        mine = fake.press_button(question, "Confirm", user="U1")
        await _press(http, adapter, mine)
        rid = str(mine["response_url"]).rsplit("/", 1)[1]
        await fake.wait_for(lambda: len(fake.responses.get(rid, [])) >= 2, what="the answer")
    assert str(payload["response_url"]).rsplit("/", 1)[1] not in fake.responses
    assert [(r.name, r.args, r.community.id) for r in runtime.commands] == [
        ("forget-me", (), "slack:T0001"),
        ("forget-me", ("confirm",), "slack:T0001"),
    ]
    assert "not a question of this workspace" in caplog.text
