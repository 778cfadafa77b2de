"""A backup made before a forget-me does not bring the member back (issue 22, finding 6),
through the real `python -m app backup` / `restore` commands and a real restart.

The data directory's `forget-journal.json` lists every forget-me outside the database:
restoring into that directory journals again those the backup lacks; restoring into a
new one needs the old directory's file (`--forget-journal`) or is refused in one line.
The bot finishes the re-journaled forget-me when it starts, before learning anything.
"""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path
from typing import Any

from app.wiring import open_runtime
from bot.forget_journal import FILE_NAME
from chroma_memory.embedding import close_chroma_client
from tests.fakes.anthropic_server import AnthropicFake
from tests.integration.conftest import ALICE, BOB, A, command, make_settings, say
from tests.integration.forget_scenario import files_holding, sqlite_files
from tests.integration.test_backup import bot_command

WORD = "marigoldtundra17"


def settings_for(data: Path) -> Any:
    return make_settings(data)


async def chatted_then_backed_up_then_forgot(
    tmp_path: Path, llm: Any, server: AnthropicFake
) -> tuple[Path, Path]:
    """A data directory where Alice argued, a backup of it, then her forget-me."""
    server.brain.ess_rule(
        contains=WORD,
        score=0.8,
        direction="supports",
        topics=["heat_pumps"],
        novelty=0.8,
        reasoning_type="empirical_data",
        source_reliability="peer_reviewed",
        summary=f"The sender cites the {WORD} field trial for heat pumps.",
    )
    data, backup = tmp_path / "data", tmp_path / "backup"
    async with open_runtime(settings_for(data), llm=llm) as runtime:
        await say(runtime, f"The {WORD} field trial shows heat pumps save money.")
        await say(runtime, "I prefer gas boilers, honestly.", user=BOB)
    made = await asyncio.to_thread(bot_command, tmp_path, data, "backup", str(backup))
    assert made.returncode == 0, made.stderr
    async with open_runtime(settings_for(data), llm=llm) as runtime:
        done = await command(runtime, "forget-me", "confirm", moderator=False)
        assert done.ok and "Forgotten" in done.text
    assert files_holding([data], [WORD, ALICE.id]) == []
    assert files_holding([backup], [WORD])  # the backup still holds her
    return data, backup


async def assert_forgotten_after_start(data: Path, llm: Any) -> None:
    settings = settings_for(data)
    async with open_runtime(settings, llm=llm) as runtime:
        await runtime.drain()
        assert await runtime.db.member_interaction_ids(A.id, ALICE.id) == []
        assert await runtime.db.member_interaction_ids(A.id, BOB.id)
        assert await runtime.db.open_forgets() == []
        [latest] = await runtime.db.community(A.id).versions(limit=1)
        assert latest.cause == "forget-me"
    needles = [WORD, ALICE.id]
    assert files_holding([*sqlite_files(settings.resolved_database_path)], needles) == []
    assert files_holding([settings.resolved_chroma_dir], needles) == []


async def test_restoring_into_a_new_directory_needs_the_old_forget_journal(
    tmp_path: Path, llm: Any, anthropic_server: AnthropicFake
) -> None:
    data, backup = await chatted_then_backed_up_then_forgot(tmp_path, llm, anthropic_server)
    fresh = tmp_path / "fresh"

    refused = await asyncio.to_thread(bot_command, tmp_path, fresh, "restore", str(backup))
    assert refused.returncode == 2
    [line] = refused.stderr.splitlines()
    assert line.startswith("error: ") and "--forget-journal" in line and FILE_NAME in line
    assert not (fresh / "sonality.sqlite3").exists()

    put_back = await asyncio.to_thread(
        bot_command,
        tmp_path,
        fresh,
        "restore",
        str(backup),
        "--forget-journal",
        str(data / FILE_NAME),
    )
    assert put_back.returncode == 0, put_back.stderr
    assert "1 forget-me request(s) made after this backup were journaled again" in put_back.stdout
    assert (fresh / FILE_NAME).read_bytes() == (data / FILE_NAME).read_bytes()
    await assert_forgotten_after_start(fresh, llm)


async def test_restoring_in_place_keeps_the_forget_me(
    tmp_path: Path, llm: Any, anthropic_server: AnthropicFake
) -> None:
    data, backup = await chatted_then_backed_up_then_forgot(tmp_path, llm, anthropic_server)
    aside = tmp_path / "aside"
    aside.mkdir()
    for name in ("sonality.sqlite3", "chromadb"):
        shutil.move(data / name, aside / name)
    # Chroma keeps one client per directory for a process's life, and the restore
    # replaces the directory under it; an operator's restored bot is a new process.
    close_chroma_client(data / "chromadb")

    put_back = await asyncio.to_thread(bot_command, tmp_path, data, "restore", str(backup))
    assert put_back.returncode == 0, put_back.stderr
    await assert_forgotten_after_start(data, llm)
    assert "journaled again" in put_back.stdout


async def test_restoring_where_another_bot_ran_needs_the_old_forget_journal(
    tmp_path: Path, llm: Any, anthropic_server: AnthropicFake
) -> None:
    """A new host's data directory where the bot was started once has a journal of its
    own, empty: the backup's directory kept the forget-me made after it, so the restore
    is refused until that journal is named, as for a directory with no journal."""
    data, backup = await chatted_then_backed_up_then_forgot(tmp_path, llm, anthropic_server)
    other = tmp_path / "other"
    async with open_runtime(settings_for(other), llm=llm):
        pass
    for name in ("sonality.sqlite3", "sonality.sqlite3-wal", "sonality.sqlite3-shm"):
        (other / name).unlink(missing_ok=True)
    shutil.rmtree(other / "chromadb")
    close_chroma_client(other / "chromadb")
    assert (other / FILE_NAME).exists()

    refused = await asyncio.to_thread(bot_command, tmp_path, other, "restore", str(backup))
    assert refused.returncode == 2
    [line] = refused.stderr.splitlines()
    assert "another data directory" in line and "--forget-journal" in line
    assert not (other / "sonality.sqlite3").exists()

    put_back = await asyncio.to_thread(
        bot_command,
        tmp_path,
        other,
        "restore",
        str(backup),
        "--forget-journal",
        str(data / FILE_NAME),
    )
    assert put_back.returncode == 0, put_back.stderr
    await assert_forgotten_after_start(other, llm)
