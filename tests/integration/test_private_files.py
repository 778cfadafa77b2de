"""Members' words stay private on the bot's machine (issue 22, finding 10).

The real `python -m app` process, started the way a shell usually starts it (umask
022, so files would be readable by every account): the data directory, the databases,
Chroma's files, the log, a `my-data` export and a backup are its user's alone. At
SONALITY_LOG_LEVEL=DEBUG no log line carries what a member wrote: the libraries' own
request dumps stay off, on the terminal (the model SDK) and on Discord (discord.py).
"""

from __future__ import annotations

import asyncio
import stat
from pathlib import Path

from tests.fakes.anthropic_fixtures import FAKE_API_KEY
from tests.fakes.anthropic_server import AnthropicFake
from tests.forked_bot import start_module
from tests.integration.conftest import ess_requests
from tests.integration.test_logging import discord_bot
from tests.integration.test_process import bot_env

SHELL_UMASK = 0o022
WORD = "quokkazanzibarish"


async def run_bot(tmp_path: Path, *args: str, stdin: bytes = b"", **env: str) -> tuple[str, str]:
    """`python -m app ...` started with umask 022; (stdout, stderr) after it exits 0."""
    proc = await start_module(  # forked (tests/forked_bot.py), with the shell's umask
        "app", *args, cwd=tmp_path, env=bot_env(tmp_path / "data", **env), umask=SHELL_UMASK
    )
    out, err = await asyncio.wait_for(proc.communicate(stdin), 120)
    assert proc.returncode == 0, err.decode()
    return out.decode(), err.decode()


def rated(server: AnthropicFake) -> list[str]:
    return [server.brain.rated_message(r) for r in ess_requests(server)]


def saved_file(path: str) -> tuple[Path, str, int]:
    """Where a file the bot wrote is, what it says and its permission bits."""
    saved = Path(path)
    return saved.parent, saved.read_text(), stat.S_IMODE(saved.stat().st_mode)


def open_up(root: Path) -> None:
    """The modes an older release left: directories 0755, files 0644."""
    for path in [root, *root.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)


def open_to_others(root: Path) -> list[str]:
    """Everything under `root` (itself included) that another account could read."""
    return [
        f"{p.relative_to(root.parent)} {stat.filemode(p.stat().st_mode)}"
        for p in [root, *root.rglob("*")]
        if p.stat().st_mode & 0o077
    ]


async def test_the_data_log_export_and_backup_are_private_and_debug_logs_no_words(
    tmp_path: Path, anthropic_server: AnthropicFake
) -> None:
    data = tmp_path / "data"
    log_file = data / "bot.log"
    env = {
        "ANTHROPIC_API_KEY": FAKE_API_KEY,
        "ANTHROPIC_BASE_URL": anthropic_server.base_url,
        "SONALITY_LOG_FILE": str(log_file),
        "SONALITY_LOG_LEVEL": "DEBUG",
    }
    out, err = await run_bot(
        tmp_path, stdin=f"tell me about {WORD}\n/sonality my-data\n".encode(), **env
    )
    reply, export_path = out.splitlines()
    assert WORD in reply  # the member's word did go through the bot
    folder, text, mode = saved_file(export_path)
    assert folder == data.resolve() and WORD in text
    assert mode == 0o600
    for expected in (data / "sonality.sqlite3", data / "chromadb" / "chroma.sqlite3", log_file):
        assert expected.is_file(), expected
    assert open_to_others(data) == []

    lines = log_file.read_text().splitlines() + err.splitlines()
    assert any(" DEBUG " in line for line in lines), "the log is at DEBUG"
    assert any("anthropic" in line or "sonality" in line for line in lines)
    assert [line for line in lines if WORD in line] == []

    # What an older release left (and backed up) was open to all: copies are not.
    open_up(data)
    out, _ = await run_bot(tmp_path, stdin=b"/sonality my-data\n", **env)
    assert out.splitlines() == [export_path]
    assert saved_file(export_path)[2] == 0o600  # the older export, rewritten, is closed
    backup = tmp_path / "backup"
    await run_bot(tmp_path, "backup", str(backup))
    assert (backup / "sonality.sqlite3").is_file()
    assert open_to_others(backup) == []
    open_up(backup)
    restored = tmp_path / "restored"
    journal = str(data / "forget-journal.json")  # a new directory needs the old journal
    await run_bot(
        tmp_path,
        "restore",
        str(backup),
        "--forget-journal",
        journal,
        SONALITY_DATA_DIR=str(restored),
    )
    assert (restored / "chromadb" / "chroma.sqlite3").is_file()
    assert open_to_others(restored) == []


async def test_discord_at_debug_logs_no_member_words(
    tmp_path: Path, anthropic_server: AnthropicFake
) -> None:
    async with discord_bot(tmp_path, anthropic_server, SONALITY_LOG_LEVEL="DEBUG") as bot:
        await bot.mention(f"what do you make of {WORD}?")
    # Stopped with SIGTERM, which lets the learning finish: the message was also rated.
    assert any(WORD in text for text in rated(anthropic_server))
    lines = bot.stdout.lines + bot.stderr.lines
    assert any(" DEBUG " in line for line in lines)
    assert [line for line in lines if WORD in line] == []
