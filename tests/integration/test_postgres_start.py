"""Starting the real bot process with DATABASE_URL: a fault is one line, a healthy server
is used (and no SQLite file is made).

The server is the session's real PostgreSQL (tests/pg.py); the bot runs as its own
process (`python -m app`, the terminal adapter) against the loopback Anthropic fake.
"""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path

import psycopg
import pytest

from app.backup import BackupError, backup, restore
from storage import Database
from storage.migrations import SCHEMA_VERSION
from tests.fakes.anthropic_fixtures import FAKE_API_KEY
from tests.forked_bot import start_module
from tests.integration.conftest import make_settings
from tests.integration.test_process import bot_env
from tests.pg import PostgresServer


async def run_bot(data: Path, base_url: str, database_url: str) -> tuple[int, str, str]:
    proc = await start_module(  # forked: tests/forked_bot.py
        "app",
        cwd=data.parent,
        env=bot_env(
            data,
            ANTHROPIC_API_KEY=FAKE_API_KEY,
            ANTHROPIC_BASE_URL=base_url,
            DATABASE_URL=database_url,
        ),
    )
    out, err = await asyncio.wait_for(proc.communicate(b"hello, is anyone there?\n"), 120)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])  # closed again on return: nothing listens


def _one_error_line(code: int, out: str, err: str) -> str:
    assert code == 2, err
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    assert lines[0].startswith("error: "), lines[0]
    assert out == "", "no member was answered"
    return lines[0]


async def test_an_unreachable_server_is_one_line_naming_the_host_never_the_password(
    tmp_path: Path, anthropic_server
) -> None:
    port = _closed_port()
    url = f"postgresql://sonality:hunter2-secret@127.0.0.1:{port}/botstate"
    line = _one_error_line(*await run_bot(tmp_path / "data", anthropic_server.base_url, url))
    assert f"127.0.0.1:{port}/botstate" in line
    assert "DATABASE_URL" in line and "server runs" in line
    assert "hunter2" not in line
    assert anthropic_server.requests == [], "the model was never asked"


async def test_a_schema_from_a_newer_bot_is_refused_in_one_line(
    tmp_path: Path, anthropic_server, postgres_server: PostgresServer
) -> None:
    url = postgres_server.new_database()
    try:
        await (await Database.open_url(url)).close()
        future = SCHEMA_VERSION + 1000
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(
                "INSERT INTO schema_migrations VALUES (%s, '2030-01-01T00:00:00+00:00')",
                (future,),
            )
        line = _one_error_line(*await run_bot(tmp_path / "data", anthropic_server.base_url, url))
        assert f"schema version {future}" in line and "newer version of the bot" in line
    finally:
        postgres_server.drop(url)


async def test_the_bot_keeps_its_state_in_postgres_when_database_url_is_set(
    tmp_path: Path, anthropic_server, postgres_server: PostgresServer
) -> None:
    url = postgres_server.new_database()  # empty: the first start creates the schema
    data = tmp_path / "data"
    try:
        code, out, err = await run_bot(data, anthropic_server.base_url, url)
        assert code == 0, err
        assert len(out.splitlines()) == 1 and "Sorry" not in out, out
        with psycopg.connect(url) as conn:
            [(version,)] = conn.execute("SELECT MAX(version) FROM schema_migrations").fetchall()
            rows = conn.execute("SELECT community_id, message FROM interactions").fetchall()
        assert version == SCHEMA_VERSION
        assert rows == [("terminal:local", "hello, is anyone there?")]
        assert not list(data.glob("*.sqlite3")), "no SQLite database beside it"
    finally:
        postgres_server.drop(url)


@pytest.mark.parametrize("value", ["sqlite:///tmp/x.db", "mysql://h/db"])
async def test_a_database_url_that_is_not_postgres_is_refused(
    tmp_path: Path, anthropic_server, value: str
) -> None:
    line = _one_error_line(*await run_bot(tmp_path / "data", anthropic_server.base_url, value))
    assert "DATABASE_URL" in line and "postgresql://" in line


def test_backup_and_restore_say_they_copy_only_the_sqlite_file(tmp_path: Path) -> None:
    settings = make_settings(tmp_path / "data", DATABASE_URL="postgresql://u:pw@db.example/s")
    for attempt in (
        lambda: backup(settings, tmp_path / "b"),
        lambda: restore(settings, tmp_path / "b"),
    ):
        with pytest.raises(BackupError, match=r"DATABASE_URL is set.*pg_dump") as err:
            attempt()
        assert "pw" not in str(err.value)
    assert not (tmp_path / "b").exists()
