"""`python -m app backup` / `restore` (app/backup.py): a restored bot is the same bot.

The round trip runs the real command line on a data directory filled by the real
runtime (SQLite, Chroma, offline embeddings, the SDK against the loopback fake), then
asks both the original and the restored bot the same question.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from app.backup import BackupError, backup, restore
from app.wiring import open_runtime
from bot.messages import IncomingMessage, ReplyKind
from sonality.state import SpongeState
from sonality.store import StateCommit
from storage import Database
from storage.maintenance import SCHEMA_VERSION
from tests.fakes.anthropic_server import AnthropicFake
from tests.integration.conftest import (
    BOB,
    A,
    chat_requests,
    make_settings,
    prompt_of,
    say,
)
from tests.integration.test_process import _start_bot, bot_env

ARGUMENT = (
    "Look at the reactor fleet data: deaths per TWh for nuclear are lower than for wind, "
    "and the lifecycle CO2 is comparable, so nuclear deserves a bigger role."
)
SUMMARY = "User cites reactor fleet data showing nuclear power's low death rate per TWh."
QUESTION = "How dangerous are atomic power plants?"  # matches SUMMARY by meaning only


def bot_command(tmp_path: Path, data_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """`python -m app ARGS` as an operator runs it: no LLM key needed, no .env around."""
    return subprocess.run(
        [sys.executable, "-m", "app", *args],
        cwd=tmp_path,
        env=bot_env(data_dir),
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )


async def chat(data_dir: Path, llm: Any, server: AnthropicFake) -> None:
    server.brain.ess_rule(
        contains="reactor fleet data",
        score=0.8,
        direction="supports",
        topics=["nuclear_energy"],
        novelty=0.9,
        reasoning_type="empirical_data",
        source_reliability="peer_reviewed",
        summary=SUMMARY,
    )
    async with open_runtime(make_settings(data_dir), llm=llm) as runtime:
        await say(runtime, ARGUMENT)
        await say(runtime, "Tell me about sourdough bread.")
        await say(runtime, "My favourite tea is oolong.", user=BOB)


async def ask_question(data_dir: Path, llm: Any, server: AnthropicFake) -> dict[str, Any]:
    """What the bot on `data_dir` holds, then what it recalls and says when asked."""
    async with open_runtime(make_settings(data_dir), llm=llm) as runtime:
        store = runtime.db.community(A.id)
        versions = [v.version for v in await store.versions(limit=100)]
        state = await store.latest_state()
        assert state is not None
        reply = await runtime.handle(
            IncomingMessage(community=A, channel_id="c1", user=BOB, text=QUESTION)
        )
        await runtime.drain()
        assert reply is not None and reply.kind is ReplyKind.ANSWER
        request = chat_requests(server)[-1]
        return {
            "versions": versions,
            "state": state.model_dump(mode="json"),
            "memories": request.last_user_text,
            "system": request.system_text,
            "prompt": prompt_of(request),
            "reply": reply.text,
            "after": [v.version for v in await store.versions(limit=100)],
        }


async def test_a_restored_backup_recalls_the_same_memories_and_answers_the_same(
    tmp_path: Path, anthropic_server: AnthropicFake, llm: Any
) -> None:
    original, restored, backup_dir = tmp_path / "original", tmp_path / "restored", tmp_path / "bk"
    await chat(original, llm, anthropic_server)

    made = await asyncio.to_thread(bot_command, tmp_path, original, "backup", str(backup_dir))
    assert made.returncode == 0, made.stderr
    assert f"backed up to {backup_dir}" in made.stdout
    assert f"restore with: python3 scripts/run.py restore {backup_dir}" in made.stdout
    manifest = json.loads((backup_dir / "manifest.json").read_text())
    assert manifest["database"]["schema_version"] == SCHEMA_VERSION
    assert manifest["database"]["integrity"] == "ok"
    assert set(manifest["database"]["communities"]) == {A.id}
    assert manifest["versions"]["chromadb"] and manifest["versions"]["sonality_bot"]
    listed = {f["path"]: f["bytes"] for f in manifest["files"]}
    on_disk = {
        p.relative_to(backup_dir).as_posix(): p.stat().st_size
        for p in backup_dir.rglob("*")
        if p.is_file() and p.name != "manifest.json"
    }
    assert listed == on_disk
    assert any(path.startswith("chromadb/") for path in listed), "the memories are in it"
    assert manifest["total_bytes"] == sum(listed.values())

    journal = original / "forget-journal.json"  # a new data directory needs the old one's
    put_back = await asyncio.to_thread(
        bot_command,
        tmp_path,
        restored,
        "restore",
        str(backup_dir),
        "--forget-journal",
        str(journal),
    )
    assert put_back.returncode == 0, put_back.stderr
    assert f"restored into {restored}" in put_back.stdout

    before = await ask_question(original, llm, anthropic_server)
    after = await ask_question(restored, llm, anthropic_server)
    assert SUMMARY in before["memories"], "the original recalls the argument"
    assert after["versions"] == before["versions"]
    assert after["versions"][0] == manifest["database"]["communities"][A.id]
    assert after["state"] == before["state"]
    assert after["memories"] == before["memories"]  # the same memories retrieved
    assert after["prompt"] == before["prompt"]
    assert after["reply"] == before["reply"]
    assert after["after"] == before["after"]


async def test_backup_refuses_while_the_bot_runs(
    tmp_path: Path, anthropic_server: AnthropicFake
) -> None:
    data_dir = tmp_path / "data"
    bot = await _start_bot(data_dir, anthropic_server.base_url, tmp_path)
    assert bot.stdin is not None and bot.stdout is not None
    bot.stdin.write(b"hello\n")
    await bot.stdin.drain()
    assert (await asyncio.wait_for(bot.stdout.readline(), 120)).decode().strip()

    refused = await asyncio.to_thread(
        bot_command, tmp_path, data_dir, "backup", str(tmp_path / "bk")
    )
    bot.stdin.close()
    assert await asyncio.wait_for(bot.wait(), 60) == 0
    assert refused.returncode == 2
    lines = [line for line in refused.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, refused.stderr
    assert f"pid {bot.pid}" in lines[0] and "stop it first" in lines[0]
    assert not (tmp_path / "bk").exists()
    assert not [name for name in os.listdir(tmp_path) if name.startswith(".bk.partial-")]

    # Once stopped, the same command works.
    made = await asyncio.to_thread(bot_command, tmp_path, data_dir, "backup", str(tmp_path / "bk"))
    assert made.returncode == 0, made.stderr


async def test_what_a_crashed_bot_left_in_the_wal_is_in_the_backup(tmp_path: Path) -> None:
    """The database is copied through SQLite, so commits not yet checkpointed count."""
    data_dir = tmp_path / "data"
    db = await Database.open(data_dir / "sonality.sqlite3")
    try:
        await db.community(A.id).commit(
            StateCommit(state=SpongeState(), cause="seed", change="seed")
        )
        wal = data_dir / "sonality.sqlite3-wal"
        assert wal.stat().st_size > 0, "the commit is still only in the WAL"
        manifest = await asyncio.to_thread(backup, make_settings(data_dir), tmp_path / "bk")
    finally:
        await db.close()
    assert manifest["database"]["communities"] == {A.id: 0}
    assert sorted(p.name for p in (tmp_path / "bk").iterdir()) == [
        "manifest.json",
        "sonality.sqlite3",
    ]


async def made_backup(tmp_path: Path) -> Path:
    data_dir = tmp_path / "data"
    async with await Database.open(data_dir / "sonality.sqlite3") as db:
        await db.community(A.id).commit(
            StateCommit(state=SpongeState(), cause="seed", change="seed")
        )
    (data_dir / "chromadb").mkdir()
    (data_dir / "chromadb" / "index.bin").write_bytes(b"\x01" * 64)
    await asyncio.to_thread(backup, make_settings(data_dir), tmp_path / "bk")
    return tmp_path / "bk"


async def test_restore_refuses_a_damaged_backup_and_writes_nothing(tmp_path: Path) -> None:
    source = await made_backup(tmp_path)
    (source / "chromadb" / "index.bin").write_bytes(b"\x02" * 64)
    target = tmp_path / "fresh"
    with pytest.raises(BackupError, match="damaged"):
        restore(make_settings(target), source)
    assert not (target / "sonality.sqlite3").exists()
    assert not (target / "chromadb").exists()


async def test_restore_never_overwrites_a_database(tmp_path: Path) -> None:
    source = await made_backup(tmp_path)
    target = tmp_path / "busy"
    target.mkdir()
    (target / "sonality.sqlite3").write_bytes(b"precious")
    with pytest.raises(BackupError, match="already exists"):
        restore(make_settings(target), source)
    assert (target / "sonality.sqlite3").read_bytes() == b"precious"


async def test_restore_refuses_a_backup_from_a_newer_release(tmp_path: Path) -> None:
    source = await made_backup(tmp_path)
    manifest_path = source / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    manifest["database"]["schema_version"] = SCHEMA_VERSION + 1
    manifest_path.write_text(json.dumps(manifest))
    with pytest.raises(BackupError, match="newer release"):
        restore(make_settings(tmp_path / "fresh"), source)
    assert not (tmp_path / "fresh" / "sonality.sqlite3").exists()


async def test_backup_refuses_a_destination_that_is_not_empty(tmp_path: Path) -> None:
    source = await made_backup(tmp_path)
    with pytest.raises(BackupError, match="not empty"):
        backup(make_settings(tmp_path / "data"), source)
    assert json.loads((source / "manifest.json").read_text())["format"] == 1


def test_help_lists_backup_and_restore(tmp_path: Path) -> None:
    shown = bot_command(tmp_path, tmp_path / "data", "--help")
    assert shown.returncode == 0
    assert "backup" in shown.stdout and "restore" in shown.stdout
    usage = bot_command(tmp_path, tmp_path / "data", "backup")
    assert usage.returncode == 2 and "DEST" in usage.stderr
