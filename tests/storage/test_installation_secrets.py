"""Slack installation tokens are encrypted at rest with SONALITY_SECRET_KEY."""

from __future__ import annotations

import shlex
import subprocess
import sys
from typing import Any

import pytest
from cryptography.fernet import Fernet

from app.startup import require_secret_key
from app.wiring import use_secret_key
from bot.interface import StartupError
from bot.settings import Settings
from storage import StorageError
from storage.platform import KEY_COMMAND, make_cipher

from .conftest import Backend

TOKEN = "xoxb-secret-7f3a9c2e41d8"


def settings(**values: Any) -> Settings:
    return Settings(_env_file=None, **values)  # type: ignore[call-arg]


KEY = {"enterprise_id": None, "team_id": "T1", "user_id": "U1", "is_enterprise_install": False}


def file_bytes(backend: Backend) -> bytes:
    """SQLite: the database and whatever SQLite keeps beside it (WAL, shared memory).
    PostgreSQL: every stored installation row (the server's files are its own)."""
    if backend.postgres:
        return "".join(str(row) for row in backend.sql("SELECT * FROM installations")).encode()
    path = backend.path
    return b"".join(p.read_bytes() for p in path.parent.iterdir() if p.name.startswith(path.name))


async def test_tokens_never_reach_the_file_in_plain_text(backend: Backend) -> None:
    key = Fernet.generate_key().decode()
    db = await backend.open()
    try:
        assert await db.use_secret_key(key) == 0
        await db.save_installation(KEY, {"bot_token": TOKEN, "team_id": "T1"})
        # Re-installing replaces the row; the old one must not linger either.
        await db.save_installation(KEY, {"bot_token": TOKEN + "-2", "team_id": "T1"})
        assert TOKEN.encode() not in file_bytes(backend)
    finally:
        await db.close()
    assert TOKEN.encode() not in file_bytes(backend)

    db = await backend.open()
    try:
        with pytest.raises(StorageError, match="SONALITY_SECRET_KEY"):
            await db.find_installation(None, "T1")  # encrypted, and no key given
        await db.use_secret_key(key)
        found = await db.find_installation(None, "T1")
        assert found == {"bot_token": TOKEN + "-2", "team_id": "T1"}
    finally:
        await db.close()


async def test_plain_rows_of_an_older_file_are_encrypted_when_a_key_is_set(
    backend: Backend,
) -> None:
    db = await backend.open()
    await db.save_installation(KEY, {"bot_token": TOKEN})
    await db.save_installation({**KEY, "team_id": "T2"}, {"bot_token": "xoxb-other-team"})
    await db.close()
    assert TOKEN.encode() in file_bytes(backend)  # the starting point: plain text

    key = Fernet.generate_key().decode()
    db = await backend.open()
    try:
        assert await db.use_secret_key(key) == 2
        assert await db.use_secret_key(key) == 0  # once only
        assert await db.find_installation(None, "T1") == {"bot_token": TOKEN}
    finally:
        await db.close()
    data = file_bytes(backend)
    assert TOKEN.encode() not in data and b"xoxb-other-team" not in data


async def test_a_wrong_key_is_one_clear_line_and_changes_nothing(backend: Backend) -> None:
    right, wrong = Fernet.generate_key().decode(), Fernet.generate_key().decode()
    db = await backend.open()
    try:
        await db.use_secret_key(right)
        await db.save_installation(KEY, {"bot_token": TOKEN})
    finally:
        await db.close()

    db = await backend.open()
    try:
        with pytest.raises(StartupError) as err:
            await use_secret_key(db, settings(SONALITY_SECRET_KEY=wrong))
        message = str(err.value)
        assert "\n" not in message and "SONALITY_SECRET_KEY does not decrypt" in message
        await db.use_secret_key(right)  # the row is intact for the right key
        assert await db.find_installation(None, "T1") == {"bot_token": TOKEN}
    finally:
        await db.close()


async def test_a_malformed_key_is_refused(backend: Backend) -> None:
    db = await backend.open()
    try:
        with pytest.raises(StorageError, match=r"not a valid key.*urlsafe_b64encode"):
            await db.use_secret_key("not-a-key")
    finally:
        await db.close()


def test_oauth_mode_needs_a_key_single_workspace_does_not() -> None:
    oauth = settings(SLACK_CLIENT_ID="1.2", SLACK_CLIENT_SECRET="s", SLACK_SIGNING_SECRET="x")
    with pytest.raises(StartupError, match=r"SONALITY_SECRET_KEY.*urlsafe_b64encode"):
        require_secret_key(oauth)
    key = Fernet.generate_key().decode()
    require_secret_key(
        settings(
            SLACK_CLIENT_ID="1.2",
            SLACK_CLIENT_SECRET="s",
            SLACK_SIGNING_SECRET="x",
            SONALITY_SECRET_KEY=key,
        )
    )
    single = settings(SLACK_BOT_TOKEN="xoxb-1", SLACK_SIGNING_SECRET="x")
    require_secret_key(single)  # stores no installation, so needs no key


def test_the_key_recipe_the_bot_prints_runs_on_a_bare_python_and_makes_a_usable_key() -> None:
    """The refusal names a command to make a key; copied from a fresh clone it must run
    without the bot's environment (`-S`: no site-packages, so no `cryptography`)."""
    program, flag, code = shlex.split(KEY_COMMAND)
    assert (program, flag) == ("python3", "-c")
    made = subprocess.run(
        [sys.executable, "-S", "-c", code], capture_output=True, text=True, timeout=30
    )
    assert made.returncode == 0, made.stderr
    key = made.stdout.strip()
    Fernet(key.encode())  # a valid key, or this raises
    assert make_cipher(key).decrypt(make_cipher(key).encrypt(b"xoxb-1")) == b"xoxb-1"
