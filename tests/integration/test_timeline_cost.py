"""What `/sonality timeline` costs and who may make it cost (issue 22, finding 12).

Behaviour, not timing (the timing is figure 9 of scripts/bench.py): the history is read
in one pass whatever its length, the replay and the picture run in the worker process,
answers are kept per community version, and commands share the member flood limit
with messages, through the real Discord adapter.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Callable
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from typing import Any

import pytest

from app.wiring import open_runtime
from bench.timeline import build_history
from bot import timeline
from bot.messages import SLOW_DOWN, CommandRequest, User
from bot.offload import Worker
from bot.runtime import Runtime
from storage import Database, community, history
from tests.fakes.anthropic_server import AnthropicFake
from tests.fakes.discord_fixtures import (
    MANAGE_GUILD,
    restores_discord_endpoints,  # noqa: F401
)
from tests.fakes.discord_server import FakeDiscord, FakeGuild, FakeUser
from tests.integration.conftest import make_settings, say
from tests.integration.discord_guild import guild_bot, slash
from tests.integration.timeline_scenario import COMMUNITY, Played, play
from tests.integration.worker_calls import die, pid
from tests.stack import on_every_stack

WAIT = 10.0


@pytest.fixture
async def played(runtime: Runtime, anthropic_server: AnthropicFake) -> Played:
    return await play(runtime, anthropic_server.brain)


@pytest.fixture
def history_reads(monkeypatch: pytest.MonkeyPatch) -> dict[str, list[Any]]:
    """Reads of stored versions made in this process, by kind: a version rebuilt on its
    own (`read_chain`, behind `state_at`), a span of rows (`read_span`), and the
    worker's connections (`HistoryReader.read`)."""
    calls: dict[str, list[Any]] = {"read_chain": [], "read_span": [], "reader": []}

    def counting(name: str, original: Any) -> Any:
        def counted(*args: Any) -> Any:
            calls[name].append(args[1:])  # without the connection (or the reader)
            return original(*args)

        return counted

    monkeypatch.setattr(history, "read_chain", counting("read_chain", history.read_chain))
    monkeypatch.setattr(community, "read_chain", counting("read_chain", community.read_chain))
    monkeypatch.setattr(history, "read_span", counting("read_span", history.read_span))
    monkeypatch.setattr(
        history.HistoryReader, "read", counting("reader", history.HistoryReader.read)
    )
    return calls


# --------------------------------------------------------------------------- one pass


async def test_the_history_is_read_in_one_pass_whatever_its_length(
    tmp_path: Path, history_reads: dict[str, list[Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    db = await Database.open(tmp_path / "db.sqlite3")
    try:
        await build_history(db, 40, community="c:short")
        await build_history(db, 240, community="c:long")
        reads: list[int] = []
        real_read = db._run_read

        async def counted(fn: Callable[[Any], Any]) -> Any:
            reads.append(1)
            return await real_read(fn)

        monkeypatch.setattr(db, "_run_read", counted)
        counts = []
        for community in ("c:short", "c:long"):
            reads.clear()
            built = await timeline.build_timeline(db, community)
            assert built.last_version == (39 if community == "c:short" else 239)
            assert built.series and any(s.moves for s in built.series)
            counts.append(len(reads))
    finally:
        await db.close()
    assert history_reads["read_chain"] == []  # no version rebuilt on its own
    assert history_reads["read_span"] == [("c:short", 0, 39), ("c:long", 0, 239)]
    assert len(history_reads["reader"]) == 2  # one connection each
    assert counts[0] == counts[1], counts  # six times the versions, the same reads


async def test_a_rollback_to_before_the_range_reads_its_target_alone(
    runtime: Runtime,
    played: Played,
    history_reads: dict[str, list[Any]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The range starts after the rollback's target: the target is read from its own
    keyframe, not by stretching the range back, and its cooling updates keep their
    speakers."""
    full = await timeline.build_timeline(runtime.db, COMMUNITY.id)
    latest = full.last_version
    monkeypatch.setattr(timeline, "MAX_VERSIONS", latest - played.rollback_target)
    history_reads["read_span"].clear()
    cut = await timeline.build_timeline(runtime.db, COMMUNITY.id)
    assert cut.truncated and cut.first_version == played.rollback_target + 1
    assert history_reads["read_span"] == [
        (COMMUNITY.id, cut.first_version, latest),
        (COMMUNITY.id, played.rollback_target, played.rollback_target),
    ]

    def moves(t: timeline.Timeline) -> set[tuple[str, int, str | None]]:
        return {
            (m.topic, m.version, m.member_id)
            for s in t.series
            for m in s.moves
            if m.version > cut.first_version
        }

    assert moves(cut) == moves(full) and moves(cut)


# --------------------------------------------------------------------------- the worker


async def test_the_worker_is_another_process_started_anew_after_it_dies() -> None:
    worker = Worker(idle_seconds=0.2)
    try:
        first = await worker.call(pid, None)
        assert first != os.getpid()
        assert await worker.call(pid, None) == first  # one worker, kept while busy
        with pytest.raises(BrokenProcessPool):
            await worker.call(die, None)
        second = await worker.call(pid, None)
        assert second not in (first, os.getpid())
        await asyncio.sleep(0.6)
        assert not worker.running  # stopped when idle, started again when needed
        assert await worker.call(pid, None) not in (first, second, os.getpid())
    finally:
        await worker.close()
    assert not worker.running


@on_every_stack  # the worker reads the SQLite file, or PostgreSQL, on its own connection
async def test_the_command_replays_and_draws_in_the_worker_and_keeps_the_answer(
    runtime: Runtime, played: Played, history_reads: dict[str, list[Any]]
) -> None:
    timelines = runtime.commands.timelines
    ask = CommandRequest(
        community=COMMUNITY,
        caller=User(id="u-sam", name="Sam"),
        is_moderator=False,
        name="timeline",
    )
    first = await runtime.run_command(ask)
    assert first.ok and first.files, first.text
    assert timelines.worker.calls == 2  # the reading and replay, then the picture
    # ...both in the worker process: this one rebuilt no version.
    assert history_reads == {"read_chain": [], "read_span": [], "reader": []}

    # Asked again: the same answer, nothing replayed again.
    again = await runtime.run_command(ask)
    assert again == first and timelines.worker.calls == 2

    # The same new question from several members at once is made once.
    topic = ask.model_copy(update={"args": ("nuclear",)})
    answers = await asyncio.gather(*(runtime.run_command(topic) for _ in range(4)))
    assert all(a == answers[0] and a.ok for a in answers)
    assert answers[0].files[0].name.endswith("-nuclear_energy.png")
    assert timelines.worker.calls == 4

    # A new version (one more message) is a new picture.
    await say(runtime, "Another message for the record.", community=COMMUNITY)
    newer = await runtime.run_command(ask)
    assert newer.ok and timelines.worker.calls == 6
    assert newer.files[0].name != first.files[0].name


# --------------------------------------------------------------------------- flood limit


async def test_the_operators_terminal_commands_are_never_flood_limited(
    tmp_path: Path, llm: Any
) -> None:
    settings = make_settings(tmp_path / "data", llm=llm, SONALITY_RATE_LIMIT_MESSAGES=2)
    async with open_runtime(settings, llm=llm) as rt:
        operator = CommandRequest(
            community=COMMUNITY,
            caller=User(id="terminal", name="you"),
            is_moderator=True,
            name="help",
            trusted=True,
        )
        assert all([(await rt.run_command(operator)).ok for _ in range(5)])
        member = operator.model_copy(update={"trusted": False, "is_moderator": False})
        answers = [await rt.run_command(member) for _ in range(3)]
        assert [a.ok for a in answers] == [True, True, False]
        assert answers[2].text == SLOW_DOWN and answers[2].private


@pytest.fixture
async def discord_guild(
    tmp_path: Path, llm: Any, anthropic_server: AnthropicFake
) -> AsyncIterator[tuple[FakeDiscord, FakeGuild, Runtime, list[FakeUser]]]:
    people = [FakeUser(9001, "alice", "Alice"), FakeUser(9002, "mod", "Mo")]
    people.append(FakeUser(9003, "bob", "Bob"))
    async with guild_bot(tmp_path / "data", llm, people, SONALITY_RATE_LIMIT_MESSAGES=3) as bot:
        yield bot.fake, bot.guild, bot.runtime, people


async def test_commands_count_with_messages_against_the_flood_limit_on_discord(
    discord_guild: tuple[FakeDiscord, FakeGuild, Runtime, list[FakeUser]],
) -> None:
    fake, guild, runtime, (alice, mod, bob) = discord_guild
    trigger = await fake.message_create(
        channel=guild.channels[0],
        author=alice,
        content=f"<@{fake.bot.id}> hello",
        mentions=[fake.bot],
    )
    await fake.wait_for(
        lambda r: (
            r.method == "POST"
            and r.path.endswith("/messages")
            and r.json
            and str((r.json.get("message_reference") or {}).get("message_id")) == trigger["id"]
        ),
        seconds=WAIT,
    )
    assert SLOW_DOWN not in (await slash(fake, guild, alice, "status"))[0]  # 2 of 3
    assert SLOW_DOWN not in (await slash(fake, guild, alice, "help"))[0]  # 3 of 3
    # The fourth in the window is refused, privately, and draws nothing.
    assert await slash(fake, guild, alice, "timeline") == (SLOW_DOWN, True)
    assert runtime.commands.timelines.worker.calls == 0
    assert await slash(fake, guild, alice, "timeline") == (SLOW_DOWN, True)  # still answered

    # Moderators count too; another member is not held back by Alice's count.
    for _ in range(3):
        assert SLOW_DOWN not in (await slash(fake, guild, mod, "status", MANAGE_GUILD))[0]
    assert await slash(fake, guild, mod, "status", MANAGE_GUILD) == (SLOW_DOWN, True)
    text, _ = await slash(fake, guild, bob, "timeline")
    assert text.startswith("**Timeline**") or "no beliefs" in text
