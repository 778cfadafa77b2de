"""`/sonality my-data` (issue 11, item 4): a member's own data as a private JSON file.

Two members talk, each with a word nobody else uses; the first asks for their data.
On every platform the file reaches only them, holds their word (message, reply turn,
episode, rating, opinion update) and never the other member's. The real runtime and
SDKs against the loopback fakes: discord.py, slack-bolt/slack_sdk, the terminal process.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from bot.command_table import PRIVATE_COMMANDS
from bot.messages import User
from bot.mydata import FORMAT, MemberExport
from bot.runtime import Runtime
from tests.fakes.anthropic_server import AnthropicFake
from tests.fakes.discord_fixtures import (
    is_ephemeral,
    restores_discord_endpoints,  # noqa: F401
)
from tests.fakes.slack_server import FakeSlack
from tests.integration.conftest import ALICE, BOB, A, command, say
from tests.integration.test_discord_e2e import World, mention, slash, world  # noqa: F401
from tests.integration.test_process import _start_bot
from tests.integration.test_slack_e2e import SlackBot, bot  # noqa: F401
from tests.slack.conftest import BOT_TOKEN, fake_slack, http_session  # noqa: F401

MINE = "quokkaplatypus"  # the caller's word
THEIRS = "axolotlnarwhal"  # the other member's word
ARGUMENT = f"A 2019 road-safety audit ({MINE}) found raised zebra crossings cut injuries."
RATING: dict[str, Any] = dict(
    contains=MINE,
    score=0.85,
    direction="supports",
    topics=["canary_zebra_crossings"],
    novelty=0.9,
    reasoning_type="empirical_data",
    source_reliability="peer_reviewed",
    summary="The sender cites a road-safety audit on raised zebra crossings.",
)


def check_export(raw: bytes, member_id: str) -> dict[str, Any]:
    """The file parses as the export shape, is the caller's, and holds their word only."""
    text = raw.decode()
    assert MINE in text
    assert THEIRS not in text
    data = json.loads(text)
    MemberExport.model_validate(data)
    assert data["format"] == FORMAT and data["member_id"] == member_id
    [message] = [m for m in data["messages"] if MINE in m["message"]]
    assert message["reply"]  # the bot's answer to it is there too
    [rating] = [
        r for r in data["ratings"] if r["payload"]["interaction_id"] == message["interaction_id"]
    ]
    assert rating["payload"]["score"] == pytest.approx(0.85)
    [update] = data["opinion_updates"]
    assert update["topic"] == "canary_zebra_crossings" and update["delta"] > 0
    assert update["interaction_id"] == message["interaction_id"]
    memories = [e["id"] for e in data["episodes"]] + [e["id"] for e in data["unwritten_episodes"]]
    assert message["interaction_id"] in memories
    assert any(MINE in t["content"] for t in data["conversation_turns"] if t["role"] == "user")
    # The evidence log's copy of the rating, kept after the audit trail's expires.
    [evidence] = [e for e in data["evidence"] if e["interaction_id"] == message["interaction_id"]]
    assert evidence["summary"] == RATING["summary"] and evidence["score"] == pytest.approx(0.85)
    assert evidence["topics"] == RATING["topics"]
    return data


# ------------------------------------------------------------------------ the runtime


async def test_the_export_holds_the_callers_rows_and_chroma_episodes(
    runtime: Runtime, llm_server: Any
) -> None:
    llm_server.brain.ess_rule(**RATING)
    await say(runtime, ARGUMENT, user=ALICE)
    await say(runtime, f"I keep {THEIRS} as a pet", user=BOB)
    await say(runtime, "what do you think now?", user=ALICE)
    await say(runtime, "and now?", user=BOB)  # closes the cooling period: a commit
    agent = runtime.registry.get(A.id)
    assert agent is not None
    await agent.flush_episodes()  # so the episodes come from Chroma, not the outbox

    result = await command(runtime, "my-data", user=ALICE, moderator=False)
    assert result.ok and result.private
    [attachment] = result.files
    assert attachment.mime_type == "application/json"
    data = check_export(attachment.data, ALICE.id)
    assert len(data["messages"]) == 2 and data["names_used"] == ["Alice"]
    assert data["unwritten_episodes"] == []
    [episode] = [e for e in data["episodes"] if e["id"] == data["messages"][0]["interaction_id"]]
    assert episode["document"] == RATING["summary"]  # what Chroma really holds
    # The committed move credits Alice's argument, not Bob's message that closed it.
    [move] = data["credited_moves"]
    assert move["topic"] == "canary_zebra_crossings" and move["stance_now"] > 0
    assert move["interaction_id"] == data["messages"][0]["interaction_id"]
    assert data["reply_usage"]["replies"] == 2 and data["reply_usage"]["output_tokens"] > 0
    assert "2 message(s)" in result.text and "2 evidence record(s)" in result.text

    # Bob's own export is his alone.
    theirs = await command(runtime, "my-data", user=BOB, moderator=False)
    text = theirs.files[0].data.decode()
    assert THEIRS in text and MINE not in text
    assert json.loads(text)["credited_moves"] == []
    # A member with nothing stored gets an empty, valid file.
    nobody = await command(runtime, "my-data", user=User(id="u-new", name="New"), moderator=False)
    empty = json.loads(nobody.files[0].data)
    assert empty["messages"] == [] and empty["episodes"] == [] and empty["ratings"] == []


async def test_moderator_actions_are_in_the_moderators_export(
    runtime: Runtime, llm_server: Any
) -> None:
    await say(runtime, "hello", user=ALICE)
    await command(runtime, "budget", "2.50", user=ALICE, moderator=True)
    await command(runtime, "rollback", "0", user=BOB, moderator=False)  # refused, recorded
    mine = json.loads((await command(runtime, "my-data", user=ALICE)).files[0].data)
    assert [(a["action"], a["args"], a["allowed"]) for a in mine["moderator_actions"]] == [
        ("budget", "2.50", True)
    ]
    theirs = json.loads((await command(runtime, "my-data", user=BOB)).files[0].data)
    assert [(a["action"], a["allowed"]) for a in theirs["moderator_actions"]] == [
        ("rollback", False)
    ]


# ------------------------------------------------------------------------ Discord


async def test_discord_sends_the_file_in_an_ephemeral_answer(world: World) -> None:  # noqa: F811
    assert "my-data" in PRIVATE_COMMANDS
    world.anthropic.brain.ess_rule(**RATING)
    await mention(world, world.guild_a, ARGUMENT)
    await mention(world, world.guild_a, f"I keep {THEIRS} as a pet", author=world.moderator)
    callback, patch = await slash(world, world.guild_a, "my-data")
    assert is_ephemeral(callback)  # deferred privately: only the caller ever sees it
    [(filename, data)] = patch.files
    assert filename == f"sonality-my-data-{world.member.id}.json"
    assert patch.json["content"].startswith("**Your data**\nEverything I keep about you")
    check_export(data, str(world.member.id))
    # The other guild's personality holds nothing of the member.
    _, patch_b = await slash(world, world.guild_b, "my-data")
    [(_, other)] = patch_b.files
    assert json.loads(other)["messages"] == [] and MINE.encode() not in other


# ------------------------------------------------------------------------ Slack


async def test_slack_sends_the_file_in_a_direct_message(
    bot: SlackBot,  # noqa: F811
    anthropic_server: AnthropicFake,
) -> None:
    anthropic_server.brain.ess_rule(**RATING)
    await bot.mention(f"<@UBOT> {ARGUMENT}", user="U1")
    await bot.mention(f"<@UBOT> I keep {THEIRS} as a pet", user="U2")
    answer = await bot.command("my-data", user="U1")
    assert answer["response_type"] == "ephemeral"
    assert "direct message" in answer["text"]
    [opened] = bot.fake.calls("conversations.open")
    assert opened.args["users"] == "U1" and opened.token == BOT_TOKEN
    [upload] = bot.fake.shared_files()
    assert upload.channels == (bot.fake.dms["U1"],) and upload.channels[0].startswith("D")
    assert upload.filename == "sonality-my-data-U1.json"
    check_export(upload.data or b"", "U1")
    assert bot.fake.posts()[-1].get("channel") != upload.channels[0]  # nothing public


async def test_slack_says_why_when_the_dm_cannot_be_opened(
    bot: SlackBot,  # noqa: F811
    anthropic_server: AnthropicFake,
) -> None:
    await bot.mention(f"<@UBOT> {ARGUMENT}", user="U1")
    bot.fake.failures["conversations.open"] = "missing_scope"
    answer = await bot.command("my-data", user="U1")
    assert answer["response_type"] == "ephemeral"
    assert "could not send you the file" in answer["text"]
    assert bot.fake.shared_files() == []  # and nothing went to the channel instead


async def test_the_fake_opens_dms_as_slack_does(fake: FakeSlack) -> None:
    from slack_sdk.errors import SlackApiError
    from slack_sdk.web.async_client import AsyncWebClient

    from tests.fakes.slack_server import FakeUser, Identity

    client = AsyncWebClient(token=BOT_TOKEN, base_url=fake.base_url)
    first = await client.conversations_open(users="U1")
    again = await client.conversations_open(users="U1")
    assert (
        first["channel"]["id"]
        == again["channel"]["id"]
        != (await client.conversations_open(users="U2"))["channel"]["id"]
    )
    fake.users["UB"] = FakeUser("UB", "Robo", is_bot=True)
    fake.identities["xoxb-no-im"] = Identity(scopes=("chat:write", "commands"))
    # slack_sdk refuses to send neither argument; a raw call shows Slack's own answer.
    with pytest.raises(SlackApiError) as raised:
        await client.api_call("conversations.open", params={})
    assert raised.value.response["error"] == "users_list_not_supplied"
    for users, error, token in (
        ("U404", "user_not_found", BOT_TOKEN),
        ("UB", "cannot_dm_bot", BOT_TOKEN),
        ("U1", "missing_scope", "xoxb-no-im"),
        ("U1", "not_authed", ""),
    ):
        with pytest.raises(SlackApiError) as raised:
            await AsyncWebClient(token=token, base_url=fake.base_url).conversations_open(
                users=users
            )
        assert raised.value.response["error"] == error


# ------------------------------------------------------------------------ terminal


async def test_the_terminal_writes_the_file_and_prints_its_path(
    tmp_path: Path, anthropic_server: AnthropicFake
) -> None:
    anthropic_server.brain.ess_rule(**RATING)
    data = tmp_path / "data"
    proc = await _start_bot(data, anthropic_server.base_url, tmp_path)
    script = "\n".join(
        [
            "/as Alice",
            ARGUMENT,
            "/as Bob",
            f"I keep {THEIRS} as a pet",
            "/as Alice",
            "what now?",
            "/sonality my-data",
        ]
    )
    out, err = await proc.communicate(script.encode() + b"\n")
    assert proc.returncode == 0, err.decode()
    lines = out.decode().splitlines()
    assert len(lines) == 7  # one answer line per input line
    path = Path(lines[-1])
    assert path.is_absolute() and path.parent == data.resolve()
    assert path.name == "sonality-my-data-terminal-alice.json"
    check_export(await asyncio.to_thread(path.read_bytes), "terminal-alice")
