"""Channel modes in the runtime (issue 25, item 1): the real runtime with the real SDK
against the loopback model server, fed neutral messages as the adapters hand them over.
The platforms themselves (discord.py, Bolt) are in test_channel_modes_platforms.py.

What a mode does with a message: `mention` answers what addressed the bot, `free` also
what did not (paced per channel), `off` nothing, without a model call. DMs have no
modes. `/sonality channel` looks for anyone and changes for moderators, `status` and
`my-data` show the modes.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from app.wiring import open_runtime
from bot.messages import (
    SLOW_DOWN,
    CommandRequest,
    CommandResult,
    Community,
    IncomingMessage,
    Reply,
    ReplyKind,
    User,
)
from bot.runtime import Runtime
from providers.anthropic import AnthropicLLM
from storage.channels import ChannelSetting
from tests.fakes.anthropic_server import AnthropicFake
from tests.integration.conftest import ALICE, BOB, A, make_settings, prompt_of

MOD = User(id="u-mod", name="Mo")
DM = Community(id="slack:T1:dm:u-alice", name="DM with Alice")


def message(
    text: str, channel: str = "c1", *, addressed: bool = False, user: User = ALICE
) -> IncomingMessage:
    return IncomingMessage(
        community=A, channel_id=channel, user=user, text=text, addressed=addressed
    )


async def channel(
    runtime: Runtime,
    *args: str,
    where: str = "c1",
    user: User = MOD,
    moderator: bool = True,
    community: Community = A,
    free_refusal: str = "",
) -> CommandResult:
    return await runtime.run_command(
        CommandRequest(
            community=community,
            caller=user,
            is_moderator=moderator,
            name="channel",
            args=args,
            channel_id=where,
            channel_name=f"name-{where}",
            free_refusal=free_refusal,
        )
    )


def asked(server: AnthropicFake, text: str) -> int:
    """How many model requests (reply, evidence, anything) showed `text`."""
    return sum(text in prompt_of(r) for r in server.requests)


@pytest.fixture
async def paced(
    tmp_path: Path, llm: AnthropicLLM, anthropic_server: AnthropicFake
) -> AsyncIterator[Runtime]:
    """A runtime whose free channels answer one unprompted message an hour."""
    settings = make_settings(tmp_path / "data", SONALITY_FREE_CHANNEL_SECONDS=3600)
    async with open_runtime(settings, llm=llm) as rt:
        yield rt


async def test_a_mention_channel_stays_silent_on_chatter_without_asking_the_model(
    runtime: Runtime, anthropic_server: AnthropicFake
) -> None:
    assert await runtime.handle(message("chatter nobody asked about")) is None
    await runtime.drain()
    assert asked(anthropic_server, "chatter nobody asked about") == 0
    reply = await runtime.handle(message("a question for you", addressed=True))
    assert reply is not None and reply.text


async def test_free_answers_unprompted_once_per_window_and_mentions_always(
    paced: Runtime, anthropic_server: AnthropicFake
) -> None:
    looked = await channel(paced, "free")
    assert looked.ok and "now `free`" in looked.text and "3600 seconds" in looked.text

    first = await paced.handle(message("first unprompted thought"))
    second = await paced.handle(message("second unprompted thought", user=BOB))
    mention = await paced.handle(message("and you, bot?", addressed=True))
    elsewhere = await paced.handle(message("chatter in a mention channel", "c2"))
    await paced.drain()

    assert first is not None and first.text
    assert second is None  # inside the window: no answer, no model call
    assert mention is not None and mention.text
    assert elsewhere is None
    assert asked(anthropic_server, "first unprompted thought") >= 2  # reply and evidence
    assert asked(anthropic_server, "second unprompted thought") == 0
    assert asked(anthropic_server, "chatter in a mention channel") == 0
    # What it answered it learned from: the member's message is stored and rated.
    rows = await paced.db.member_rows(A.id, ALICE.id)
    assert [m.message for m in rows.messages] == ["first unprompted thought", "and you, bot?"]
    assert len(rows.evidence) == 2


async def test_off_answers_nothing_and_calls_no_model_but_commands_work(
    runtime: Runtime, anthropic_server: AnthropicFake
) -> None:
    assert (await channel(runtime, "off")).ok
    before = len(anthropic_server.requests)
    assert await runtime.handle(message("are you there?", addressed=True)) is None
    assert await runtime.handle(message("hello?")) is None
    await runtime.drain()
    assert len(anthropic_server.requests) == before
    status = await runtime.run_command(
        CommandRequest(community=A, caller=ALICE, is_moderator=False, name="status")
    )
    assert status.ok and "Channels: mention unless set (1 set apart; moderators see which)" in (
        status.text
    )
    # The other channels of the community still answer.
    assert await runtime.handle(message("still here?", "c2", addressed=True)) is not None


async def test_looking_is_for_everyone_changing_for_moderators(runtime: Runtime) -> None:
    refused = await channel(runtime, "free", user=ALICE, moderator=False)
    assert not refused.ok and refused.text == "Only moderators can use `/sonality channel`."
    assert await runtime.db.channel_settings(A.id) == []

    await channel(runtime, "off", where="c2")
    await channel(runtime, "free", where="c3")
    await channel(runtime, "mention", where="c4")  # the default: not listed apart
    member_view = await channel(runtime, user=ALICE, moderator=False)
    assert member_view.ok
    # A moderator may set a private channel apart: members see how many, not which.
    assert member_view.text.splitlines() == [
        "This channel: `mention` (the default): I answer when I'm mentioned or replied to.",
        "2 channel(s) are set apart from the default (`mention`); moderators see which.",
    ]
    mod_view = await channel(runtime, where="c2")
    assert mod_view.text.startswith("This channel: `off`: I answer nothing here")
    assert "• #name-c2 (c2): `off`, set by Mo on " in mod_view.text


async def test_a_typed_mode_is_checked_and_nothing_changes_on_a_bad_one(
    runtime: Runtime,
) -> None:
    bad = await channel(runtime, "loud")
    assert not bad.ok and bad.private
    assert bad.text == (
        "`loud` is not a mode: use `mention`, `free`, `off`. "
        "Usage: `/sonality channel [mention|free|off]`."
    )
    assert (await channel(runtime, "FREE")).ok  # typed in capitals on a text platform
    [setting] = await runtime.db.channel_settings(A.id)
    assert setting.mode == "free"


async def test_free_is_refused_where_the_platform_cannot_read_the_messages(
    runtime: Runtime,
) -> None:
    why = "A free channel needs what this platform lacks."
    refused = await channel(runtime, "free", free_refusal=why)
    assert not refused.ok and refused.private and refused.text == why
    assert await runtime.db.channel_settings(A.id) == []
    assert (await channel(runtime, "off", free_refusal=why)).ok


async def test_the_default_mode_applies_to_channels_nobody_set(
    tmp_path: Path, llm: AnthropicLLM, anthropic_server: AnthropicFake
) -> None:
    settings = make_settings(tmp_path / "data", SONALITY_CHANNEL_MODE="off")
    async with open_runtime(settings, llm=llm) as rt:
        assert await rt.handle(message("anyone?", addressed=True)) is None
        await channel(rt, "mention", where="c2")
        assert await rt.handle(message("here?", "c2", addressed=True)) is not None
        # A DM has no channel modes: the default `off` does not silence it.
        dm = IncomingMessage(community=DM, channel_id="D1", user=ALICE, text="hi in private")
        assert await rt.handle(dm) is not None
        refused = await channel(rt, community=DM, where="D1", moderator=False)
        assert not refused.ok and "here I answer every message" in refused.text
        looked = await channel(rt, where="c9")
        assert looked.text.startswith("This channel: `off` (the default)")
    assert asked(anthropic_server, "anyone?") == 0


async def test_an_unprompted_message_over_the_flood_limit_gets_no_notice(
    tmp_path: Path, llm: AnthropicLLM, anthropic_server: AnthropicFake
) -> None:
    settings = make_settings(
        tmp_path / "data", SONALITY_RATE_LIMIT_MESSAGES=1, SONALITY_FREE_CHANNEL_SECONDS=0
    )
    async with open_runtime(settings, llm=llm) as rt:
        await channel(rt, "free")
        assert await rt.handle(message("one")) is not None
        assert await rt.handle(message("two")) is None  # not "slow down": nobody asked
        warned = await rt.handle(message("and you?", addressed=True, user=BOB))
        assert warned is not None and warned.text != SLOW_DOWN  # Bob has his own count
        slowed = await rt.handle(message("again?", addressed=True, user=BOB))
        assert slowed == Reply(text=SLOW_DOWN, kind=ReplyKind.NOTICE)  # asked: told
    assert asked(anthropic_server, "two") == 0


async def test_status_and_my_data_show_the_modes(runtime: Runtime) -> None:
    await channel(runtime, "free", where="c2")
    status = await runtime.run_command(
        CommandRequest(community=A, caller=ALICE, is_moderator=False, name="status")
    )
    assert "Channels: mention unless set (1 set apart; moderators see which)" in status.text
    mod_status = await runtime.run_command(
        CommandRequest(community=A, caller=MOD, is_moderator=True, name="status")
    )
    assert "Channels: mention unless set (#name-c2 (c2): free)" in mod_status.text
    mod_data = await runtime.run_command(
        CommandRequest(community=A, caller=MOD, is_moderator=True, name="my-data")
    )
    [modes] = [json.loads(f.data)["channel_modes"] for f in mod_data.files]
    assert [(m["channel_id"], m["mode"], m["set_by_id"]) for m in modes] == [("c2", "free", MOD.id)]
    member_data = await runtime.run_command(
        CommandRequest(community=A, caller=ALICE, is_moderator=False, name="my-data")
    )
    assert [json.loads(f.data)["channel_modes"] for f in member_data.files] == [[]]


async def test_an_off_channel_answers_no_listed_bot_and_a_bot_is_never_unprompted(
    tmp_path: Path, llm: AnthropicLLM, anthropic_server: AnthropicFake
) -> None:
    helper = User(id="B0HELPER", name="Helper", is_bot=True)
    settings = make_settings(
        tmp_path / "data",
        SONALITY_ANSWER_BOTS=helper.id,
        SONALITY_FREE_CHANNEL_SECONDS=0,
        SONALITY_BOT_EXCHANGES=1,
    )
    async with open_runtime(settings, llm=llm) as rt:
        await channel(rt, "off")
        await channel(rt, "free", where="c2")
        assert await rt.handle(message("helper asks in off", addressed=True, user=helper)) is None
        # Unanswered, it took nothing of the bots' run there (one reply in a row).
        await channel(rt, "mention")
        again = await rt.handle(message("helper asks again", addressed=True, user=helper))
        assert again is not None and again.text
        assert await rt.handle(message("helper chats in free", "c2", user=helper)) is None
        answered = await rt.handle(
            message("helper asks in free", "c2", addressed=True, user=helper)
        )
        assert answered is not None and answered.text
    assert asked(anthropic_server, "helper asks in off") == 0
    assert asked(anthropic_server, "helper chats in free") == 0


async def test_a_forgotten_moderator_is_named_by_pseudonym_and_the_mode_stays(
    runtime: Runtime,
) -> None:
    await channel(runtime, "off", where="c2")
    assert "set by Mo on " in (await channel(runtime, where="c2")).text  # read once: kept
    other = User(id="u-other-mod", name="Olga")
    done = await runtime.run_command(
        CommandRequest(
            community=A,
            caller=other,
            is_moderator=True,
            name="forget-user",
            args=(MOD.id, "they", "asked"),
        )
    )
    assert done.ok, done.text
    looked = await channel(runtime, where="c2", user=other)
    assert looked.text.startswith("This channel: `off`")
    assert "Mo" not in looked.text and MOD.id not in looked.text
    assert "set by member-" in looked.text
    assert await runtime.handle(message("still off?", "c2", addressed=True)) is None


async def test_a_mode_set_while_a_message_reads_the_modes_is_not_lost(
    runtime: Runtime, anthropic_server: AnthropicFake, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A message that read the modes before a moderator changed one, and finished
    reading after, must not keep the old modes: on SQLite they are never read again."""
    db = runtime.db
    read = db.channel_settings
    has_read, go_on = asyncio.Event(), asyncio.Event()

    async def slow_read(community_id: str) -> list[ChannelSetting]:
        found = await read(community_id)
        has_read.set()
        await go_on.wait()
        return found

    monkeypatch.setattr(db, "channel_settings", slow_read)
    early = asyncio.create_task(runtime.handle(message("asked before the change", addressed=True)))
    await has_read.wait()
    monkeypatch.setattr(db, "channel_settings", read)
    assert (await channel(runtime, "off")).ok
    go_on.set()
    assert await early is not None  # it came before the change: answered
    assert await runtime.handle(message("asked after the change", addressed=True)) is None
    await runtime.drain()
    assert asked(anthropic_server, "asked after the change") == 0


@pytest.mark.parametrize("dm_moderation", [False, True])
async def test_no_mode_is_set_from_a_dm_even_by_a_moderator(
    tmp_path: Path, llm: AnthropicLLM, dm_moderation: bool
) -> None:
    """A DM is nobody's channel: whether its member counts as a moderator there
    (SONALITY_DM_MODERATION) or not, `channel off` changes nothing."""
    settings = make_settings(tmp_path / "data", SONALITY_DM_MODERATION=dm_moderation)
    async with open_runtime(settings, llm=llm) as rt:
        refused = await channel(rt, "off", community=DM, where="D1", user=ALICE)
        assert not refused.ok and refused.private
        assert ("here I answer every message" in refused.text) is dm_moderation
        assert await rt.db.channel_settings(DM.id) == []
        dm = IncomingMessage(community=DM, channel_id="D1", user=ALICE, text="still there?")
        assert await rt.handle(dm) is not None
