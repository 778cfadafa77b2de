"""Slack end to end: real Bolt + slack_sdk ↔ fake Slack, real runtime ↔ fake Anthropic.

Nothing in between is mocked: signed HTTP requests (or Socket Mode envelopes) go into
`SlackAdapter`, which drives the runtime from `app.wiring.open_runtime` (SQLite, Chroma,
offline embeddings, the engine), whose LLM calls go through the real anthropic SDK to
the loopback fake. Assertions are on what Slack and the model server received and on
the stored personality.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import aiohttp
import pytest

from adapters.slack import SlackAdapter
from app.wiring import open_runtime
from bot.messages import LLM_DOWN, Community
from bot.runtime import Runtime
from bot.settings import Settings
from bot.timeline import HEIGHT_PX, WIDTH_PX
from providers.anthropic import AnthropicLLM
from sonality.agent import SonalityAgent
from tests.fakes.anthropic_server import AnthropicFake, Delay, Fault
from tests.fakes.slack_server import FakeSlack, post_signed
from tests.integration.conftest import chat_requests, make_settings, prompt_of
from tests.integration.test_isolation_and_commands import CANARY, CANARY_TEXT
from tests.integration.test_timeline import png_size
from tests.slack.conftest import (  # noqa: F401  (fixtures "fake", "http")
    APP_TOKEN,
    BOT_TOKEN,
    SECRET,
    adapter_url,
    command_form,
    fake_slack,
    http_session,
    mention_event,
    running,
    slack_values,
)

log = logging.getLogger(__name__)

T1 = "slack:T1"
T2 = "slack:T2"
TOPIC = "canary_zebra_crossings"


# --------------------------------------------------------------------------------------
# The stack: one open runtime + one running adapter, over a data dir that can be reopened


@dataclass
class SlackBot:
    runtime: Runtime
    adapter: SlackAdapter
    fake: FakeSlack
    http: aiohttp.ClientSession
    _ts: itertools.count[int] = field(default_factory=lambda: itertools.count(1))

    def next_ts(self) -> str:
        return f"1700000{next(self._ts):03d}.000100"

    async def deliver(self, body: dict[str, Any], **kw: Any) -> tuple[int, float]:
        status, _, took = await post_signed(
            self.http, adapter_url(self.adapter), SECRET, json_body=body, **kw
        )
        return status, took

    async def mention(self, text: str, *, team: str = "T1", user: str = "U1") -> dict[str, Any]:
        """@mention the bot, wait for its threaded reply and for the learning behind it."""
        ts = self.next_ts()
        before = len(self.fake.posts())
        body = mention_event(event_id=f"Ev{ts}", team=team, user=user, ts=ts, text=text)
        status, _ = await self.deliver(body)
        assert status == 200
        await self.fake.wait_for(lambda: len(self.fake.posts()) > before, what=f"reply to {ts}")
        await self.runtime.drain()
        [reply] = [p for p in self.fake.posts()[before:] if p.get("thread_ts") == ts]
        return reply

    async def command(self, text: str, *, team: str = "T1", user: str = "U1") -> dict[str, Any]:
        """/sonality `text`; returns the single answer posted to its response_url."""
        rid = f"r{len(self.fake.responses) + 1}"
        form = command_form(self.fake, text, user=user, team=team, rid=rid)
        status, body, took = await post_signed(
            self.http, adapter_url(self.adapter), SECRET, form=form
        )
        assert status == 200 and body == "" and took < 3.0
        await self.fake.wait_for(lambda: self.fake.responses.get(rid), what=f"/sonality {text}")
        await self.fake.settle(quiet=0.1)
        [answer] = self.fake.responses[rid]
        return answer

    async def agent(self, community_id: str) -> SonalityAgent:
        return await self.runtime.registry.agent_for(Community(id=community_id))

    async def teach_canary(self, server: AnthropicFake) -> None:
        """The canary argument, then 3 more messages: the cooling period of 3 commits it."""
        server.brain.ess_rule(**cast(dict[str, Any], CANARY))
        await self.mention(f"<@UBOT> {CANARY_TEXT}")
        agent = self.runtime.registry.get(T1)
        assert agent is not None and TOPIC not in agent.sponge.opinion_vectors  # staged only
        for i in range(3):
            await self.mention(f"<@UBOT> filler {i}")
        assert TOPIC in agent.sponge.opinion_vectors


def slack_settings(data_dir: Path, fake: FakeSlack, **overrides: Any) -> Settings:
    """The production default for DMs (off); the Slack unit tests turn them on."""
    return make_settings(data_dir, **slack_values(fake, **{"SLACK_ALLOW_DMS": False, **overrides}))


@contextlib.asynccontextmanager
async def slack_bot(
    settings: Settings, llm: AnthropicLLM, fake: FakeSlack, http: aiohttp.ClientSession
) -> AsyncIterator[SlackBot]:
    """What `python -m app` assembles: the adapter stores Slack state in `runtime.db`."""
    async with open_runtime(settings, llm=llm) as runtime:
        adapter = SlackAdapter(runtime, settings, runtime.db, host="127.0.0.1", port=0)
        async with running(adapter):
            yield SlackBot(runtime, adapter, fake, http)


@pytest.fixture
async def bot(
    tmp_path: Path, llm: AnthropicLLM, fake: FakeSlack, http: aiohttp.ClientSession
) -> AsyncIterator[SlackBot]:
    async with slack_bot(slack_settings(tmp_path / "data", fake), llm, fake, http) as stack:
        yield stack


# --------------------------------------------------------------------------------------
# Tests


async def test_http_two_workspaces_one_token_keep_separate_personalities(
    bot: SlackBot, fake: FakeSlack, anthropic_server: AnthropicFake
) -> None:
    # The model is slow on the first call: the HTTP ack must not wait for it.
    anthropic_server.enqueue(Delay(1.5))
    ts = bot.next_ts()
    body = mention_event(event_id="EvFirst", team="T1", ts=ts, text="<@UBOT> hello there")
    status, took = await bot.deliver(body)
    log.info("HTTP ack of an app_mention took %.3f s", took)
    assert status == 200
    assert took < 1.0, f"ack took {took:.3f} s: it waited for the model"
    assert fake.posts() == [], "the reply must come after the ack, not before"
    await fake.wait_for(fake.posts, what="threaded reply")
    await bot.runtime.drain()
    await fake.settle(quiet=0.2)
    [post] = fake.posts()
    assert post["thread_ts"] == ts and post["channel"] == "C0001"
    assert post["text"] == "[reply] hello there"
    assert fake.calls("chat.postMessage")[0].token == BOT_TOKEN

    await bot.teach_canary(anthropic_server)
    await bot.mention("<@UBOT> Tell me about zebra crossings.", team="T2", user="U2")
    assert set(bot.runtime.registry.loaded()) == {T1, T2}
    t2_prompt = prompt_of(chat_requests(anthropic_server)[-1])
    assert "road-safety audit" not in t2_prompt and TOPIC not in t2_prompt

    in_t1 = await bot.command("beliefs", team="T1")
    assert in_t1["response_type"] == "ephemeral"
    assert in_t1["text"].startswith("*Beliefs*\n")
    assert f"{TOPIC}: +0.04 (for)" in in_t1["text"] and "road-safety audit" in in_t1["text"]
    in_t2 = await bot.command("beliefs", team="T2")
    assert in_t2["text"].startswith("*Beliefs*\n")
    assert "canary" not in in_t2["text"] and "audit" not in in_t2["text"]
    assert TOPIC not in (await bot.agent(T2)).sponge.opinion_vectors
    assert (await bot.agent(T2)).sponge.interaction_count == 1
    assert (await bot.agent(T1)).sponge.interaction_count == 5


async def test_retried_event_is_answered_once_even_across_a_restart(
    tmp_path: Path,
    llm: AnthropicLLM,
    fake: FakeSlack,
    http: aiohttp.ClientSession,
    anthropic_server: AnthropicFake,
) -> None:
    settings = slack_settings(tmp_path / "data", fake)
    event = mention_event(event_id="EvRetry", team="T1", text="<@UBOT> are you awake?")
    async with slack_bot(settings, llm, fake, http) as first:
        assert (await first.deliver(event))[0] == 200
        await fake.wait_for(fake.posts, what="reply")
        await first.runtime.drain()
        agent = await first.agent(T1)
        count, version = agent.sponge.interaction_count, agent.sponge.version
        assert count == 1
        model_calls = len(anthropic_server.requests)

        assert (await first.deliver(event, retry_num=1))[0] == 200
        await fake.settle()
        await first.runtime.drain()
        assert len(fake.posts()) == 1
        assert agent.sponge.interaction_count == count
        assert len(anthropic_server.requests) == model_calls

    # The restarted process: a new runtime and a new adapter on the same data dir.
    async with slack_bot(settings, llm, fake, http) as second:
        assert second.adapter is not first.adapter and second.runtime is not first.runtime
        assert (await second.deliver(event, retry_num=2))[0] == 200
        await fake.settle()
        await second.runtime.drain()
        assert len(fake.posts()) == 1, "the redelivery after the restart was answered again"
        assert len(anthropic_server.requests) == model_calls
        agent = await second.agent(T1)
        assert agent.sponge.interaction_count == count and agent.sponge.version == version

        # The restarted bot does answer new events (so the silence above means dedup).
        await second.mention("<@UBOT> and now?")
        assert len(fake.posts()) == 2
        assert agent.sponge.interaction_count == count + 1


async def test_only_moderators_roll_back(
    bot: SlackBot, fake: FakeSlack, anthropic_server: AnthropicFake
) -> None:
    await bot.teach_canary(anthropic_server)
    agent = await bot.agent(T1)
    store = bot.runtime.db.community(T1)
    before = agent.sponge.version
    assert before == 4 and await store.latest_version() == before

    refused = await bot.command("rollback 0", user="U2")
    assert refused["response_type"] == "ephemeral"
    assert "Only moderators" in refused["text"]
    assert agent.sponge.version == before and await store.latest_version() == before
    assert TOPIC in agent.sponge.opinion_vectors
    assert [c.args["user"] for c in fake.calls("users.info")].count("U2") == 1

    done = await bot.command("rollback 0", user="UADMIN")
    assert done["response_type"] == "in_channel", "a rollback is announced to the channel"
    assert f"Reset to the seed personality as v{before + 1}" in done["text"]
    assert agent.sponge.version == before + 1 and await store.latest_version() == before + 1
    assert agent.sponge.opinion_vectors == {}
    beliefs = await bot.command("beliefs")
    assert "canary" not in beliefs["text"] and "no beliefs" in beliefs["text"]

    actions = await bot.runtime.db.moderator_actions(T1)
    assert [(a.actor_id, a.allowed) for a in actions] == [("UADMIN", True), ("U2", False)]


async def test_socket_mode_envelope_is_acked_and_answered_by_the_runtime(
    tmp_path: Path,
    llm: AnthropicLLM,
    fake: FakeSlack,
    http: aiohttp.ClientSession,
    anthropic_server: AnthropicFake,
) -> None:
    anthropic_server.brain.reply_rule(
        contains="over the socket", text="Sockets are **fine**, thanks for asking."
    )
    settings = slack_settings(
        tmp_path / "data", fake, SLACK_APP_TOKEN=APP_TOKEN, SLACK_SIGNING_SECRET=None
    )
    async with slack_bot(settings, llm, fake, http) as sock:
        assert sock.adapter.http_port is None
        [opened] = fake.calls("apps.connections.open")
        assert opened.token == APP_TOKEN
        await fake.wait_for(lambda: fake.ws_connections == 1, what="websocket")

        event = mention_event(
            event_id="EvSock", team="T1", text="<@UBOT> all good over the socket?"
        )
        envelope = await fake.push_envelope("events_api", event)
        assert await fake.wait_for_ack(envelope) == {"envelope_id": envelope}
        await fake.wait_for(fake.posts, what="reply over the Web API")
        await sock.runtime.drain()
        await fake.settle(quiet=0.2)
        agent = sock.runtime.registry.get(T1)
        assert agent is not None and agent.sponge.interaction_count == 1

    [post] = fake.posts()
    assert post["thread_ts"] == event["event"]["ts"] and post["channel"] == "C0001"
    assert post["text"] == "Sockets are *fine*, thanks for asking."  # brain's answer, as mrkdwn
    [asked] = chat_requests(anthropic_server)
    assert "all good over the socket?" in asked.last_user_text


async def test_llm_outage_posts_one_apology_and_changes_nothing(
    bot: SlackBot, fake: FakeSlack, anthropic_server: AnthropicFake
) -> None:
    await bot.mention("<@UBOT> warm up")
    agent = await bot.agent(T1)
    store = bot.runtime.db.community(T1)
    version, count = agent.sponge.version, agent.sponge.interaction_count
    stored = await store.latest_version()

    anthropic_server.enqueue(*[Fault(status=500, retry_after_ms=5)] * 3)
    apology = await bot.mention("<@UBOT> are you there?")
    await fake.settle(quiet=0.2)
    assert anthropic_server.script_left == 0, "the SDK retried twice before giving up"
    assert apology["text"] == LLM_DOWN
    assert len(fake.posts()) == 2
    assert agent.sponge.version == version and agent.sponge.interaction_count == count
    assert await store.latest_version() == stored
    assert fake.reactions == set(), "the thinking reaction is removed after the apology"


async def test_timeline_is_uploaded_to_the_channel_the_command_came_from(
    bot: SlackBot, anthropic_server: AnthropicFake
) -> None:
    await bot.teach_canary(anthropic_server)
    form = command_form(bot.fake, "timeline zebra 30", user="U1", team="T1", rid="rt")
    form["channel_id"] = "C0TIMELINE"
    status, _, _ = await post_signed(bot.http, adapter_url(bot.adapter), SECRET, form=form)
    assert status == 200
    await bot.fake.wait_for(bot.fake.shared_files, what="the uploaded timeline")
    await bot.fake.settle(quiet=0.1)
    [upload] = bot.fake.shared_files()
    assert upload.filename == f"timeline-v4-{TOPIC}.png"
    assert png_size(upload.data or b"") == (WIDTH_PX, HEIGHT_PX)
    assert upload.alt_txt is not None and upload.alt_txt.startswith(f"Opinion timeline: {TOPIC}")
    [start] = bot.fake.calls("files.getUploadURLExternal")
    assert start.token == BOT_TOKEN and start.args["length"] == str(len(upload.data or b""))
    [complete] = bot.fake.calls("files.completeUploadExternal")
    assert complete.args["channel_id"] == "C0TIMELINE"
    assert json.loads(complete.args["files"]) == [{"id": upload.file_id, "title": "Timeline"}]
    assert upload.channels == ("C0TIMELINE",)
    assert upload.initial_comment is not None
    assert upload.initial_comment.startswith("Opinion timeline: how my view on")
    assert "rt" not in bot.fake.responses  # the picture in the channel is the answer
