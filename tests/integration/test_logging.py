"""Where the real `python -m app` process logs, and in what shape.

Discord mode against the fake Discord (the bot's own process, its own discord.py):
the log goes to stdout, as container platforms expect, and no file is written unless
SONALITY_LOG_FILE names one; SONALITY_LOG_FORMAT=json makes every line one JSON object;
the once-a-minute housekeeping job (run every 0.2 s here) adds no INFO lines. The
terminal community keeps its screen: INFO goes only to the named file, which rotates.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.fakes.anthropic_server import AnthropicFake
from tests.fakes.discord_server import FakeDiscord, FakeGuild, FakeUser
from tests.integration.test_discord_e2e import is_reply_post
from tests.integration.test_isolation_and_commands import CANARY, CANARY_TEXT
from tests.integration.test_process import _start_bot
from tests.integration.test_startup import run_bot_process, stderr_lines

WAIT = 120.0


@dataclass
class Output:
    """A stream of the bot process, read line by line as it arrives."""

    lines: list[str] = field(default_factory=list)
    changed: asyncio.Event = field(default_factory=asyncio.Event)

    async def read(self, stream: asyncio.StreamReader) -> None:
        while line := await stream.readline():
            self.lines.append(line.decode("utf-8", "replace").rstrip("\n"))
            self.changed.set()

    async def wait_for(self, predicate: Callable[[str], bool], what: str) -> str:
        async def seen() -> str:
            while True:
                found = next((line for line in self.lines if predicate(line)), None)
                if found is not None:
                    return found
                self.changed.clear()
                await self.changed.wait()

        try:
            return await asyncio.wait_for(seen(), WAIT)
        except TimeoutError:
            raise AssertionError(f"never logged {what}: {self.lines[-30:]}") from None


@dataclass
class DiscordBot:
    fake: FakeDiscord
    guild: FakeGuild
    member: FakeUser
    stdout: Output
    stderr: Output

    async def mention(self, text: str) -> None:
        """@mention the bot and wait until its reply was posted."""
        trigger = await self.fake.message_create(
            channel=self.guild.channels[0],
            author=self.member,
            content=f"<@{self.fake.bot.id}> {text}",
            mentions=[self.fake.bot],
        )
        await self.fake.wait_for(lambda r: is_reply_post(r, trigger), seconds=WAIT)


@contextlib.asynccontextmanager
async def discord_bot(
    tmp_path: Path, anthropic_server: AnthropicFake, **env: str
) -> AsyncIterator[DiscordBot]:
    fake = FakeDiscord()
    member = FakeUser(9001, "alice", "Alice")
    guild = fake.add_guild("Guild A", members=[member])
    await fake.start()
    proc = await _start_bot(
        tmp_path / "data",
        anthropic_server.base_url,
        tmp_path,
        asyncio.subprocess.PIPE,
        DISCORD_TOKEN=fake.token,
        DISCORD_API_BASE_URL=fake.api_base,
        DISCORD_GATEWAY_URL=fake.gateway_url,
        SONALITY_IDLE_CHECK_SECONDS="0.2",  # housekeeping runs many times meanwhile
        **env,
    )
    assert proc.stdout is not None and proc.stderr is not None
    out, err = Output(), Output()
    readers = [
        asyncio.create_task(out.read(proc.stdout)),
        asyncio.create_task(err.read(proc.stderr)),
    ]
    try:
        # READY is logged once the guilds have been sent, so messages may follow.
        await out.wait_for(lambda line: "has connected to Gateway" in line, "the session")
        yield DiscordBot(fake, guild, member, out, err)
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGTERM)
        code = await asyncio.wait_for(proc.wait(), 60)
        await asyncio.gather(*readers)
        await fake.close()
    assert code == 0, err.lines[-20:]


@pytest.mark.parametrize("log_format", ["text", "json"])
async def test_the_bot_logs_to_stdout_and_an_opinion_commit_is_one_info_line(
    tmp_path: Path, anthropic_server: AnthropicFake, log_format: str
) -> None:
    anthropic_server.brain.ess_rule(**CANARY)
    async with discord_bot(
        tmp_path,
        anthropic_server,
        SONALITY_LOG_FORMAT=log_format,
        SONALITY_OPINION_COOLING_PERIOD="0",  # staged now, committed on the next message
    ) as bot:
        await bot.stdout.wait_for(lambda line: "Discord: synced" in line, "the command sync")
        await bot.mention(CANARY_TEXT)
        await bot.mention("and what else?")
        moved = await bot.stdout.wait_for(lambda line: "opinion moved" in line, "the commit")
    community = f"discord:{bot.guild.id}"
    lines = bot.stdout.lines
    assert not bot.stderr.lines, "nothing on stderr: the log is on stdout"
    assert not (tmp_path / "data" / "sonality.log").exists(), "no file unless one is named"
    routine = ("Running job", "executed successfully", "HTTP Request:")
    assert not [line for line in lines if any(r in line for r in routine)]
    if log_format == "text":
        assert " INFO sonality.agent: " in moved and f"{community}: opinion moved" in moved
        return
    entries = [json.loads(line) for line in lines]  # every line is one JSON object
    for entry in entries:
        assert {"time", "level", "logger", "message"} <= set(entry), entry
    [commit] = [e for e in entries if "opinion moved" in e["message"]]
    assert commit["level"] == "INFO" and commit["logger"] == "sonality.agent"
    assert commit["community"] == community
    assert commit["message"].startswith(f"{community}: opinion moved (v2): canary_zebra_crossings")
    assert commit["time"].endswith("+00:00")


async def test_the_terminal_keeps_its_screen_and_the_named_file_rotates(
    tmp_path: Path, anthropic_server: AnthropicFake
) -> None:
    log_file = tmp_path / "logs" / "bot.log"  # its folder does not exist yet
    proc = await _start_bot(
        tmp_path / "data",
        anthropic_server.base_url,
        tmp_path,
        SONALITY_LOG_FILE=str(log_file),
        SONALITY_LOG_FILE_MAX_BYTES="1000",
        SONALITY_LOG_FILE_BACKUPS="2",
        SONALITY_LOG_LEVEL="DEBUG",  # a line a message, so the file must rotate
    )
    lines = ["hello", "/sonality status", *(f"message {n}" for n in range(10)), "bye"]
    out, err = await asyncio.wait_for(proc.communicate("\n".join(lines).encode() + b"\n"), WAIT)
    assert proc.returncode == 0, err.decode()
    assert len(out.decode().splitlines()) == len(lines), "one answer line per input line, no log"
    assert not [line for line in err.decode().splitlines() if " DEBUG " in line or " INFO " in line]
    rotated = sorted(p.name for p in log_file.parent.iterdir())
    assert rotated == ["bot.log", "bot.log.1", "bot.log.2"], rotated
    text = "".join(p.read_text(encoding="utf-8") for p in log_file.parent.iterdir())
    assert " DEBUG " in text and " INFO " in text
    assert not (tmp_path / "data" / "sonality.log").exists()


def test_a_log_file_that_cannot_be_opened_is_one_line_and_exit_code_2(tmp_path: Path) -> None:
    from tests.fakes.anthropic_fixtures import FAKE_API_KEY

    folder = tmp_path / "a-folder"
    folder.mkdir()
    proc = run_bot_process(tmp_path, ANTHROPIC_API_KEY=FAKE_API_KEY, SONALITY_LOG_FILE=str(folder))
    assert proc.returncode == 2, proc.stderr
    assert stderr_lines(proc) == [
        f"error: SONALITY_LOG_FILE={folder} is not allowed: it is a directory"
    ]
