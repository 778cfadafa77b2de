"""Storage faults at start: each is found before any member is answered, as ONE line.

Each case runs the real `python -m app` (terminal community) against the fake Anthropic
server with a message waiting on stdin, so a fault the start-up check missed would show
as an answer (or a "Sorry, something went wrong") on stdout. Every file that existed
before the run must be byte-identical afterwards, with the same mtime.

Permissions mean nothing to root, so when the tests run as root the cases built on
them (an unwritable directory, a read-only file) run the bot as the unprivileged user
`nobody` in a directory it owns; they are skipped only if that user cannot run Python.
"""

from __future__ import annotations

import asyncio
import os
import pwd
import shutil
import sqlite3
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from storage import Database
from storage.migrations import MIGRATIONS
from tests.checkout import importing_this_checkout
from tests.fakes.anthropic_fixtures import FAKE_API_KEY
from tests.integration.test_process import bot_env

IS_ROOT = os.geteuid() == 0


def _nobody() -> pwd.struct_passwd | None:
    try:
        return pwd.getpwnam("nobody")
    except KeyError:
        return None


def _nobody_can_run_the_bot() -> str:
    """Why the permission cases cannot run as `nobody` here ("" when they can)."""
    user = _nobody()
    if user is None:
        return "running as root and there is no user 'nobody' to drop to"
    probe = subprocess.run(
        [sys.executable, "-c", "import app.startup"],
        cwd="/",
        env=importing_this_checkout(os.environ),
        user=user.pw_uid,
        group=user.pw_gid,
        extra_groups=[],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    if probe.returncode:
        return f"running as root and 'nobody' cannot import the bot: {probe.stderr[-200:]}"
    return ""


@dataclass
class Workspace:
    """A directory holding the data directory, owned by whoever runs the bot."""

    root: Path
    as_nobody: bool

    @property
    def data(self) -> Path:
        return self.root / "data"

    def hand_over(self) -> None:
        """Give every file to `nobody` (root runs only), keeping modes and mtimes."""
        user = _nobody()
        if not self.as_nobody or user is None:
            return
        for path in [self.root, *self.root.rglob("*")]:
            os.chown(path, user.pw_uid, user.pw_gid, follow_symlinks=False)

    def popen_kwargs(self) -> dict[str, Any]:
        user = _nobody()
        if not self.as_nobody or user is None:
            return {}
        return {"user": user.pw_uid, "group": user.pw_gid, "extra_groups": []}


@pytest.fixture
def workspace(tmp_path: Path) -> Iterator[Workspace]:
    if not IS_ROOT:
        yield Workspace(tmp_path, as_nobody=False)
        return
    # pytest's tmp_path lives under a 0700 directory of root's; nobody needs a way in.
    root = Path(tempfile.mkdtemp(prefix="sonality-faults-"))
    root.chmod(0o755)
    try:
        yield Workspace(root, as_nobody=True)
    finally:
        for path in [root, *root.rglob("*")]:
            if path.is_dir():
                path.chmod(0o755)
        shutil.rmtree(root, ignore_errors=True)


def snapshot(root: Path) -> dict[str, tuple[bytes, int, int]]:
    """Every file's bytes, mtime and mode."""
    files: dict[str, tuple[bytes, int, int]] = {}
    for path in sorted(root.rglob("*")):
        if path.is_file():
            info = path.stat()
            files[str(path.relative_to(root))] = (path.read_bytes(), info.st_mtime_ns, info.st_mode)
    return files


async def run_bot(workspace: Workspace, base_url: str, **env: str) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "app",
        cwd=workspace.root,
        env=bot_env(
            workspace.data, ANTHROPIC_API_KEY=FAKE_API_KEY, ANTHROPIC_BASE_URL=base_url, **env
        ),
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        **workspace.popen_kwargs(),
    )
    out, err = await asyncio.wait_for(proc.communicate(b"hello, is anyone there?\n"), 120)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def make_real_database(path: Path) -> None:
    """A database as the bot leaves it: migrated, one community, closed cleanly."""
    db = await Database.open(path)
    try:
        await db.touch_community("terminal", name="terminal")
    finally:
        await db.close()


# --- the cases: each prepares the workspace and returns the words its line must hold ----


async def unwritable_data_dir(ws: Workspace) -> tuple[dict[str, str], list[str]]:
    await make_real_database(ws.data / "sonality.sqlite3")
    ws.data.chmod(0o555)
    return {}, [f"SONALITY_DATA_DIR={ws.data}", "not writable", "make it writable"]


async def data_dir_is_a_file(ws: Workspace) -> tuple[dict[str, str], list[str]]:
    ws.data.write_text("my notes, not a directory\n")
    return {}, [f"SONALITY_DATA_DIR={ws.data}", "it is a file, not a directory"]


async def read_only_database(ws: Workspace) -> tuple[dict[str, str], list[str]]:
    database = ws.data / "sonality.sqlite3"
    await make_real_database(database)
    database.chmod(0o444)
    return {}, [str(database), "is read-only", "make it writable", "SONALITY_DATA_DIR"]


async def unwritable_database_dir(ws: Workspace) -> tuple[dict[str, str], list[str]]:
    elsewhere = ws.root / "db"
    database = elsewhere / "sonality.sqlite3"
    await make_real_database(database)
    elsewhere.chmod(0o555)  # the file itself stays writable; SQLite's -wal/-shm cannot be made
    return {"SONALITY_DATABASE_PATH": str(database)}, [
        str(elsewhere),
        "not writable",
        "journal",
        "SONALITY_DATABASE_PATH",
    ]


async def garbage_database(ws: Workspace) -> tuple[dict[str, str], list[str]]:
    ws.data.mkdir()
    database = ws.data / "sonality.sqlite3"
    database.write_bytes(os.urandom(8192))
    return {}, [str(database), "not a SQLite database", "restore it from a backup"]


async def truncated_database(ws: Workspace) -> tuple[dict[str, str], list[str]]:
    database = ws.data / "sonality.sqlite3"
    await make_real_database(database)
    whole = database.read_bytes()
    assert len(whole) >= 8192, "a real database spans several pages"
    database.write_bytes(whole[: len(whole) // 2])
    return {}, [str(database), "truncated", "restore it from a backup"]


async def schema_from_the_future(ws: Workspace) -> tuple[dict[str, str], list[str]]:
    database = ws.data / "sonality.sqlite3"
    await make_real_database(database)
    future = len(MIGRATIONS) + 1000  # far ahead: other work may add migrations meanwhile
    conn = sqlite3.connect(database)
    with conn:
        conn.execute(
            "INSERT INTO schema_migrations (version, applied_at) VALUES (?, ?)",
            (future, "2030-01-01T00:00:00+00:00"),
        )
    conn.close()
    return {}, [
        str(database),
        f"schema version {future}",
        "this bot knows only up to",
        "newer version of the bot",
    ]


async def garbage_chroma_file(ws: Workspace) -> tuple[dict[str, str], list[str]]:
    await make_real_database(ws.data / "sonality.sqlite3")
    chroma = ws.data / "chromadb" / "chroma.sqlite3"
    chroma.parent.mkdir()
    chroma.write_bytes(os.urandom(20000))
    return {}, [str(chroma), "not a SQLite database", "restore", "backup"]


Case = Callable[[Workspace], Any]
PERMISSION_CASES = {unwritable_data_dir, read_only_database, unwritable_database_dir}


@pytest.mark.parametrize(
    "case",
    [
        unwritable_data_dir,
        data_dir_is_a_file,
        read_only_database,
        unwritable_database_dir,
        garbage_database,
        truncated_database,
        schema_from_the_future,
        garbage_chroma_file,
    ],
    ids=lambda case: case.__name__,
)
async def test_a_storage_fault_is_one_line_at_start_and_changes_nothing(
    workspace: Workspace, anthropic_server, case: Case
) -> None:
    if case in PERMISSION_CASES and IS_ROOT and (why := _nobody_can_run_the_bot()):
        pytest.skip(why)
    env, expected = await case(workspace)
    workspace.hand_over()
    before = snapshot(workspace.root)

    code, out, err = await run_bot(workspace, anthropic_server.base_url, **env)

    assert code == 2, err
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    assert lines[0].startswith("error: "), lines[0]
    for words in expected:
        assert words in lines[0], (words, lines[0])
    assert out == "", "no member was answered"
    assert anthropic_server.requests == [], "the model was never asked"
    after = snapshot(workspace.root)
    for name, (content, mtime, mode) in before.items():
        assert name in after, f"{name} was removed"
        assert after[name][0] == content, f"{name} was changed"
        assert after[name][1:] == (mtime, mode), f"{name} was touched"
    created = set(after) - set(before)
    assert created <= {"data/sonality.lock"}, created  # the lock on the data directory
    assert all(after[name][0] == b"" for name in created), "the lock is released, empty"


async def test_a_healthy_store_passes_the_same_checks(
    workspace: Workspace, anthropic_server
) -> None:
    """The checks refuse only what is wrong: a real database and Chroma directory left
    by an earlier run start and answer."""
    workspace.as_nobody = False  # the embedding model's cache is root's when root runs this
    await make_real_database(workspace.data / "sonality.sqlite3")
    workspace.hand_over()
    code, out, err = await run_bot(workspace, anthropic_server.base_url)
    assert code == 0, err
    assert len(out.splitlines()) == 1, out
    assert "Sorry" not in out
