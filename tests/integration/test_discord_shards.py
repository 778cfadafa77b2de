"""Discord shard ranges: DISCORD_SHARD_IDS / DISCORD_SHARD_COUNT split the guilds over
processes, so each guild's events reach exactly one of them.

Two real bot processes (`python -m app`, discord.py's own AutoShardedClient) with the
shard ranges {0} and {1} of 2 run against one fake Discord, which routes as Discord
does: a guild belongs to shard `(guild_id >> 22) % count`, and each connection gets the
GUILD_CREATE and MESSAGE_CREATE events of its own shard's guilds only. Run twice: each
process with a SQLite file of its own (what it answered is read back from its own
file), and both on one PostgreSQL database (DATABASE_URL), where each guild must be
answered exactly once between them.
"""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path
from typing import Any

import pytest

from adapters.discord import DiscordAdapter
from bot.interface import StartupError
from storage import Database
from tests.fakes.anthropic_server import AnthropicFake
from tests.fakes.discord_server import FakeDiscord, FakeGuild, FakeUser
from tests.integration.conftest import make_settings
from tests.integration.test_discord_e2e import is_reply_post
from tests.integration.test_logging import Output
from tests.integration.test_process import _start_bot
from tests.integration.test_startup import run_bot_process, stderr_lines
from tests.pg import PostgresServer

WAIT = 120.0
COUNT = 2
REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("storage", ["sqlite", "postgresql"])
async def test_each_guild_is_answered_by_the_process_owning_its_shard_only(
    tmp_path: Path, anthropic_server: AnthropicFake, request: pytest.FixtureRequest, storage: str
) -> None:
    shared = {"PYTHONPATH": str(REPO)}  # the processes run this checkout's code
    if storage == "postgresql":
        server: PostgresServer = request.getfixturevalue("postgres_server")
        shared["DATABASE_URL"] = server.new_database()
    fake = FakeDiscord()
    alice = FakeUser(9001, "alice", "Alice")
    guilds = {
        shard: [
            fake.add_guild(f"Guild {shard}-{n}", members=[alice], shard=(shard, COUNT))
            for n in range(2)
        ]
        for shard in range(COUNT)
    }
    await fake.start()
    procs: dict[int, Any] = {}
    readers: list[asyncio.Task[None]] = []
    outputs: dict[int, tuple[Output, Output]] = {}
    try:
        for shard in range(COUNT):
            proc = await _start_bot(
                tmp_path / f"data-{shard}",
                anthropic_server.base_url,
                tmp_path,
                asyncio.subprocess.DEVNULL,
                DISCORD_TOKEN=fake.token,
                DISCORD_API_BASE_URL=fake.api_base,
                DISCORD_GATEWAY_URL=fake.gateway_url,
                DISCORD_SHARD_COUNT=str(COUNT),
                DISCORD_SHARD_IDS=str(shard),
                **shared,
            )
            assert proc.stdout is not None and proc.stderr is not None
            out, err = Output(), Output()
            readers += [
                asyncio.create_task(out.read(proc.stdout)),
                asyncio.create_task(err.read(proc.stderr)),
            ]
            procs[shard], outputs[shard] = proc, (out, err)
        for shard, (out, _) in outputs.items():
            connected = f"Shard ID {shard} has connected to Gateway"
            await out.wait_for(lambda line: connected in line, f"shard {shard}'s session")  # noqa: B023
        assert sorted(tuple(i["shard"]) for i in fake.identifies) == [(0, COUNT), (1, COUNT)]

        triggers: dict[int, list[dict[str, Any]]] = {shard: [] for shard in guilds}
        for shard, owned in guilds.items():
            for guild in owned:
                trigger = await fake.message_create(
                    channel=guild.channels[0],
                    author=alice,
                    content=f"<@{fake.bot.id}> hello from {guild.name}",
                    mentions=[fake.bot],
                )
                triggers[shard].append(trigger)
        every = [t for ts in triggers.values() for t in ts]
        for trigger in every:
            await fake.wait_for(lambda r: is_reply_post(r, trigger), seconds=WAIT)  # noqa: B023
        await asyncio.sleep(0.5)  # time for a wrong second answer to arrive, if one would
        for trigger in every:
            assert len([r for r in fake.requests if is_reply_post(r, trigger)]) == 1
    finally:
        for proc in procs.values():
            if proc.returncode is None:
                proc.send_signal(signal.SIGTERM)
        codes = [await asyncio.wait_for(proc.wait(), 60) for proc in procs.values()]
        await asyncio.gather(*readers)
        await fake.close()
    assert codes == [0] * len(procs), [outputs[s][1].lines[-10:] for s in outputs]

    if storage == "postgresql":  # one database: each guild answered once between them
        db = await Database.open_url(shared["DATABASE_URL"])
        try:
            for owned in guilds.values():
                for guild in owned:
                    answered = await db.member_interaction_ids(_community(guild), str(alice.id))
                    assert len(answered) == 1, guild.name
        finally:
            await db.close()
        return
    # Who answered what: each process's own database.
    for shard in range(COUNT):
        db = await Database.open(tmp_path / f"data-{shard}" / "sonality.sqlite3")
        try:
            for owner, owned in guilds.items():
                for guild in owned:
                    answered = await db.member_interaction_ids(_community(guild), str(alice.id))
                    assert len(answered) == (1 if owner == shard else 0), (shard, guild.name)
        finally:
            await db.close()


def _community(guild: FakeGuild) -> str:
    return f"discord:{guild.id}"


async def test_a_shard_discord_does_not_know_is_closed_with_4010_and_named(
    tmp_path: Path,
) -> None:
    """The fake closes an IDENTIFY for a shard outside the count with 4010, as Discord
    does; the adapter turns it into the one-line start-up error naming the setting."""
    fake = FakeDiscord()
    fake.add_guild("Guild A")
    await fake.start()
    settings = make_settings(
        tmp_path / "data",
        DISCORD_TOKEN=fake.token,
        DISCORD_API_BASE_URL=fake.api_base,
        DISCORD_GATEWAY_URL=fake.gateway_url,
        DISCORD_SHARD_COUNT=2,
    )

    adapter = DiscordAdapter(
        object(),  # type: ignore[arg-type]  # never reached: the session is refused first
        settings,
        client_options={"guild_ready_timeout": 0.05, "shard_ids": [2]},  # 2 of 0..1
        identify_delay=0,
    )
    try:
        with pytest.raises(StartupError, match=r"4010.*DISCORD_SHARD_COUNT"):
            await asyncio.wait_for(adapter.start(), 30)
    finally:
        await adapter.close()
        await fake.close()
    assert [i["shard"] for i in fake.identifies] == [[2, 2]]


async def test_a_sharded_client_without_a_count_takes_the_gateways_recommendation(
    tmp_path: Path,
) -> None:
    """discord.py's AutoShardedClient with no shard count asks GET /gateway/bot, whose
    `shards` the fake reports as Discord does; every shard then connects here."""
    fake = FakeDiscord()
    fake.recommended_shards = 2
    for shard in range(2):
        fake.add_guild(f"Guild {shard}", shard=(shard, 2))
    await fake.start()
    settings = make_settings(
        tmp_path / "data",
        DISCORD_TOKEN=fake.token,
        DISCORD_API_BASE_URL=fake.api_base,
        DISCORD_GATEWAY_URL=fake.gateway_url,
        DISCORD_SHARD_COUNT=1,  # the sharded client; its count is left to the gateway below
    )
    adapter = DiscordAdapter(
        object(),  # type: ignore[arg-type]  # no message arrives in this test
        settings,
        client_options={"guild_ready_timeout": 0.05, "shard_count": None},
        identify_delay=0,
    )
    task = asyncio.create_task(adapter.start())
    try:
        await asyncio.wait_for(adapter.wait_until_ready(), 30)
        assert sorted(tuple(i["shard"]) for i in fake.identifies) == [(0, 2), (1, 2)]
        assert fake.find("GET", "/gateway/bot")
    finally:
        await adapter.close()
        await asyncio.wait_for(task, 10)
        await fake.close()


@pytest.mark.parametrize(
    ("ids", "count", "allowed"),
    [
        ("0-3", "2", "shard 2 does not exist with DISCORD_SHARD_COUNT=2"),
        ("0,x", "2", 'shard numbers and ranges such as "0,1" or "0-3"'),
        ("3-1", "4", "runs backwards"),
        ("0", None, "needs DISCORD_SHARD_COUNT"),
    ],
)
def test_a_bad_shard_range_is_one_line_and_exit_code_2(
    tmp_path: Path, ids: str, count: str | None, allowed: str
) -> None:
    env = {"DISCORD_SHARD_IDS": ids, **({"DISCORD_SHARD_COUNT": count} if count else {})}
    proc = run_bot_process(tmp_path, ANTHROPIC_API_KEY="x", DISCORD_TOKEN="t", **env)
    assert proc.returncode == 2, proc.stderr
    lines = stderr_lines(proc)
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith(f"error: DISCORD_SHARD_IDS={ids} is not allowed: ")
    assert allowed in lines[0]
