"""`python -m app backup DEST` and `python -m app restore SOURCE`.

A bot's memory is two stores that must travel together: the SQLite file (every
personality version, the conversation buffers, the outbox of memories not yet written)
and the Chroma directory (the episodes recalled into prompts). A backup is both, plus a
`manifest.json` naming versions, sizes and checksums.

Why the bot must be stopped (the backup takes the data directory's lock, which a
running bot holds, and otherwise refuses in one line): SQLite alone could be copied
online, its backup API reads a consistent snapshot while others write. Chroma has no
such API; its directory is a SQLite file plus index files written at different
moments, and a copy taken while the bot writes them can be a set that never existed
together. A pause signal to the running bot would have to stop every memory write in
the engine and wait for them, which is a large change for a
stop that lasts seconds: `systemctl stop`, back up, `systemctl start`. While the backup
holds the lock, a bot that starts meanwhile is refused the same way, so nothing can
write behind its back. The database is still copied with the backup API, not as bytes:
that folds in whatever a crashed bot left in the `-wal` file and yields one file.

Restore writes into the configured data directory (SONALITY_DATA_DIR, or the database
and Chroma paths set apart from it) and only into an empty one: it never overwrites a
database, so a mistyped directory cannot destroy the memory you meant to keep. It
checks every checksum first and refuses a backup made by a newer release (its schema
would be unknown here); an older one is migrated forward when the bot next starts.

A backup made before a forget-me must not bring the member back, nor one made before
a member deleted a message bring the message back. The database's own journals of
both are restored with it, from before; the data directory's `forget-journal.json`
(bot/forget_journal.py) is not part of any backup and lists every forget-me and every
message taken back. Restore journals again, in the restored database, each one it lacks,
and the bot finishes them when it starts, before anything is learned. A data directory
without that file (a new one) is refused unless the file of the directory the backup
came from is named (`--forget-journal`), or its loss is acknowledged
(`--without-forget-journal`): a restore never forgets a forget-me silently.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import platform
import shutil
import sqlite3
import sys
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any

from app.invocation import program
from app.lock import LOCK_FILE, DataDirLock
from bot.forget_journal import FILE_NAME as JOURNAL_FILE
from bot.forget_journal import ForgetJournal, ForgetJournalError
from bot.interface import StartupError
from bot.settings import Settings
from storage import open_database
from storage.deletion import DeletionEntry
from storage.forget import JournalEntry
from storage.maintenance import SCHEMA_VERSION, DatabaseFacts, backup_database, describe_database

MANIFEST = "manifest.json"
FORMAT = 1
DATABASE_FILE = "sonality.sqlite3"
CHROMA_DIR = "chromadb"
COMMANDS = ("backup", "restore")


class BackupError(StartupError):
    """Why a backup or restore did not happen, as the one line to print (exit code 2)."""


# ------------------------------------------------------------------------ command line


def add_commands(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register `backup` and `restore` in `python -m app`'s command line."""
    backup_cmd = commands.add_parser(
        "backup",
        help="copy the database and memories to a new directory (stop the bot first)",
        description="Copy the SQLite database (online backup API) and the Chroma "
        "directory of SONALITY_DATA_DIR into DEST, with a manifest.json of versions, "
        "sizes and checksums. The bot must be stopped: the backup takes its lock.",
    )
    backup_cmd.add_argument("dest", metavar="DEST", type=Path, help="a new or empty directory")
    restore_cmd = commands.add_parser(
        "restore",
        help="put a backup into an empty data directory",
        description="Check a backup's checksums and copy it into SONALITY_DATA_DIR, "
        "which must not hold a database or memories yet.",
    )
    restore_cmd.add_argument(
        "source", metavar="SOURCE", type=Path, help="a directory made by `backup`"
    )
    journal = restore_cmd.add_mutually_exclusive_group()
    journal.add_argument(
        "--forget-journal",
        metavar="FILE",
        type=Path,
        help=f"the {JOURNAL_FILE} of the data directory the backup was made from, when "
        "restoring into a new one (forget-me requests and message deletions made after the "
        "backup are re-applied)",
    )
    journal.add_argument(
        "--without-forget-journal",
        action="store_true",
        help=f"restore into a new data directory although the old {JOURNAL_FILE} is lost "
        "(members who ran forget-me, and messages deleted, after the backup would come back)",
    )


def run_command(args: argparse.Namespace) -> int:
    """Run `backup` or `restore` from parsed arguments; the exit code."""
    from app.startup import load_settings

    try:
        settings = load_settings()
        if args.command == "backup":
            manifest = backup(settings, args.dest)
            print(describe(manifest, f"backed up to {args.dest}"))
            print(f"restore with: {program()} restore {args.dest}")
        else:
            journal = None if args.forget_journal is None else ForgetJournal(args.forget_journal)
            manifest = restore(
                settings,
                args.source,
                journal=journal,
                without_journal=args.without_forget_journal,
            )
            print(describe(manifest, f"restored into {settings.data_dir}"))
            print(describe_reapplied(manifest))
    except StartupError as exc:
        text = " ".join(str(exc).split())
        print(text if text.startswith("error: ") else f"error: {text}", file=sys.stderr)
        return 2
    return 0


def describe(manifest: dict[str, Any], done: str) -> str:
    database = manifest["database"]
    memories = [f for f in manifest["files"] if f["path"].startswith(CHROMA_DIR + "/")]
    return (
        f"{done}: {len(database['communities'])} communities, schema v"
        f"{database['schema_version']}, database {_size(database['bytes'])}, memories "
        f"{_size(sum(f['bytes'] for f in memories))} in {len(memories)} files"
    )


def _size(count: int) -> str:
    if count < 1024:
        return f"{count} bytes"
    size = count / 1024
    for unit in ("KB", "MB"):
        if size < 1024:
            return f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} GB"


# ----------------------------------------------------------------------------- backup


def backup(settings: Settings, dest: Path) -> dict[str, Any]:
    """Copy database and Chroma into the new directory `dest`; its manifest.

    Written under a hidden sibling name and renamed at the end, so a `dest` that
    exists is always a complete backup.
    """
    _sqlite_only(settings, "back up")
    database = settings.resolved_database_path
    chroma = settings.resolved_chroma_dir
    if not database.is_file():
        raise BackupError(
            f"error: nothing to back up: there is no database at {database} "
            f"(SONALITY_DATA_DIR={settings.data_dir})"
        )
    dest = Path(dest).absolute()
    if dest.exists() and (not dest.is_dir() or any(dest.iterdir())):
        raise BackupError(f"error: {dest} already exists and is not empty: choose a new directory")
    if dest.resolve().is_relative_to(chroma.resolve()):
        raise BackupError(f"error: {dest} is inside the Chroma directory {chroma}")
    settings.data_dir.mkdir(parents=True, exist_ok=True)  # where the lock lives
    with locked_data_dir(settings.data_dir, "back up"):
        partial = dest.parent / f".{dest.name}.partial-{uuid.uuid4().hex[:8]}"
        partial.mkdir(parents=True)
        try:
            facts = backup_database(database, partial / DATABASE_FILE)
            if facts.integrity != "ok":
                raise BackupError(
                    f"error: the database {database} fails SQLite's integrity check "
                    f"({facts.integrity}); nothing was backed up"
                )
            if chroma.is_dir():
                shutil.copytree(chroma, partial / CHROMA_DIR)
            manifest = _manifest(settings, partial, facts)
            (partial / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
            _make_private(partial)
            _fsync_tree(partial)
            if dest.exists():
                dest.rmdir()  # empty, checked above
            partial.rename(dest)
        except BaseException:
            shutil.rmtree(partial, ignore_errors=True)
            raise
    return manifest


def _sqlite_only(settings: Settings, verb: str) -> None:
    """The backup copies the SQLite file; a PostgreSQL database is the server's to copy."""
    if settings.postgres_url is not None:
        raise BackupError(
            f"error: cannot {verb} here: DATABASE_URL is set, so the state lives in "
            "PostgreSQL and this command only copies the SQLite file; use pg_dump / "
            "pg_restore for the database, and copy SONALITY_CHROMA_DIR beside it"
        )


def _manifest(settings: Settings, root: Path, facts: DatabaseFacts) -> dict[str, Any]:
    files = [_file_entry(root, path) for path in sorted(root.rglob("*")) if path.is_file()]
    database_bytes = next(f["bytes"] for f in files if f["path"] == DATABASE_FILE)
    return {
        "format": FORMAT,
        "created_at": datetime.now(UTC).isoformat(),
        "versions": {
            "sonality_bot": _version("sonality-bot"),
            "chromadb": _version("chromadb"),
            "sqlite": sqlite3.sqlite_version,
            "python": platform.python_version(),
        },
        "source": {
            "data_dir": str(settings.data_dir.absolute()),
            "database": str(settings.resolved_database_path.absolute()),
            "chroma_dir": str(settings.resolved_chroma_dir.absolute()),
            # Which forget journal stays behind with the data directory (`restore`).
            "forget_journal": ForgetJournal.in_data_dir(settings.data_dir).journal_id(),
        },
        "database": {"file": DATABASE_FILE, "bytes": database_bytes, **asdict(facts)},
        "chroma": {"dir": CHROMA_DIR} if (root / CHROMA_DIR).is_dir() else None,
        "files": files,
        "total_bytes": sum(f["bytes"] for f in files),
    }


def _file_entry(root: Path, path: Path) -> dict[str, Any]:
    return {
        "path": path.relative_to(root).as_posix(),
        "bytes": path.stat().st_size,
        "sha256": _sha256(path),
    }


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _version(distribution: str) -> str | None:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


def _make_private(root: Path) -> None:
    """A copy holds members' words: its owner's alone (directories 0700, files 0600),
    whatever the modes of what was copied (copytree keeps the source's)."""
    for path in [root, *root.rglob("*")]:
        path.chmod(0o700 if path.is_dir() else 0o600)


def _fsync_tree(root: Path) -> None:
    """On disk before the rename makes the backup visible as complete."""
    for path in root.rglob("*"):
        if path.is_file():
            with path.open("rb") as fh:
                os.fsync(fh.fileno())


# ---------------------------------------------------------------------------- restore


def restore(
    settings: Settings,
    source: Path,
    *,
    journal: ForgetJournal | None = None,
    without_journal: bool = False,
) -> dict[str, Any]:
    """Check the backup at `source`, then copy it into the empty data directory and
    journal again the forget-me requests and message deletions it lacks (`journal`: the
    forget journal of the directory it came from, when the data directory has none of
    its own). The manifest returned notes them under ``reapplied`` and ``taken_back``."""
    _sqlite_only(settings, "restore")
    source = Path(source).absolute()
    manifest = read_manifest(source)
    verify(source, manifest)
    here = ForgetJournal.in_data_dir(settings.data_dir)
    schema = int(manifest["database"]["schema_version"])
    if schema > SCHEMA_VERSION:
        raise BackupError(
            f"error: {source} was made by a newer release (database schema v{schema}; this "
            f"one knows v{SCHEMA_VERSION}): install that release or a later one to restore it"
        )
    database = settings.resolved_database_path
    chroma = settings.resolved_chroma_dir
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    with locked_data_dir(settings.data_dir, "restore"):
        for existing in (database, database.with_name(database.name + "-wal")):
            if existing.exists():
                raise BackupError(
                    f"error: {existing} already exists: restore into an empty data directory "
                    f"(set SONALITY_DATA_DIR to a new one, or move this one aside)"
                )
        if chroma.exists() and any(chroma.iterdir()):
            raise BackupError(
                f"error: {chroma} already holds memories: restore into an empty data directory "
                f"(set SONALITY_DATA_DIR to a new one, or move this one aside)"
            )
        _same_journal(here, manifest, given=journal is not None or without_journal)
        forgotten, deleted = _forget_entries(here, journal, without_journal)
        tag = uuid.uuid4().hex[:8]
        database.parent.mkdir(parents=True, exist_ok=True)
        partial_db = database.with_name(f".{database.name}.restore-{tag}")
        partial_chroma = chroma.with_name(f".{chroma.name}.restore-{tag}")
        try:
            shutil.copyfile(source / DATABASE_FILE, partial_db)
            if manifest.get("chroma"):
                shutil.copytree(source / CHROMA_DIR, partial_chroma)
                _make_private(partial_chroma)
            partial_db.chmod(0o600)
            restored = describe_database(partial_db)
            if restored.communities != manifest["database"]["communities"]:
                raise BackupError("error: the restored database differs from the manifest")
            reapplied, taken_back = _rejournal(partial_db, forgotten, deleted)
            if partial_chroma.exists():
                if chroma.exists():
                    chroma.rmdir()  # empty, checked above
                partial_chroma.rename(chroma)
            if journal is not None and journal.path.absolute() != here.path.absolute():
                journal.copy_to(here)  # later forget-me requests add to it here
            here.ensure()
            partial_db.rename(database)  # last: a database without memories is never left
        except (OSError, ForgetJournalError) as exc:
            raise BackupError(f"error: nothing was restored: {exc}") from None
        finally:
            for leftover in ("", "-wal", "-shm"):
                partial_db.with_name(partial_db.name + leftover).unlink(missing_ok=True)
            shutil.rmtree(partial_chroma, ignore_errors=True)
    return {**manifest, "reapplied": reapplied, "taken_back": taken_back}


def describe_reapplied(manifest: dict[str, Any]) -> str:
    count = len(manifest.get("reapplied") or [])
    deleted = len(manifest.get("taken_back") or [])
    if not count and not deleted:
        return "forget journal: every forget-me and deleted message is in the restored database"
    parts = [f"{count} forget-me request(s)"] if count else []
    parts += [f"{deleted} deleted message(s)"] if deleted else []
    return (
        f"forget journal: {' and '.join(parts)} made after this backup were journaled "
        "again; the bot finishes them when it starts, before learning anything"
    )


def _same_journal(here: ForgetJournal, manifest: dict[str, Any], *, given: bool) -> None:
    """Refuse a restore into a data directory whose forget journal is not the one the
    backup's data directory kept (a bot started once in a new directory made its own),
    unless a journal was named or its loss acknowledged: the forget-me requests made
    after the backup are in the other one, and would come back."""
    theirs = (manifest.get("source") or {}).get("forget_journal")
    mine = here.journal_id()
    if given or theirs is None or mine is None or mine == theirs:
        return
    raise BackupError(
        f"error: {here.path} is the forget journal of another data directory than the one "
        "this backup was made from, so forget-me requests made there after the backup "
        f"would come back: pass --forget-journal with that directory's {JOURNAL_FILE} (or "
        "--without-forget-journal if it is lost)"
    )


def _forget_entries(
    here: ForgetJournal, given: ForgetJournal | None, without: bool
) -> tuple[list[JournalEntry], list[DeletionEntry]]:
    """The forget-me requests and message deletions to keep in force: the data
    directory's journal file and the one named; refused when there is neither and their
    loss was not acknowledged."""
    if given is not None and not given.exists():
        raise BackupError(f"error: --forget-journal {given.path}: no such file")
    if given is None and not here.exists() and not without:
        raise BackupError(
            f"error: {here.path.parent} has no {JOURNAL_FILE}, so forget-me requests made "
            f"after this backup would come back: pass --forget-journal with the "
            f"{JOURNAL_FILE} of the data directory the backup was made from (or "
            "--without-forget-journal if it is lost)"
        )
    journals = [here] if given is None else [here, given]
    try:
        read = [j.read() for j in journals]
        return [e for forgets, _ in read for e in forgets], [d for _, ds in read for d in ds]
    except ForgetJournalError as exc:
        raise BackupError(f"error: {exc}") from None


def _rejournal(
    database: Path, entries: list[JournalEntry], deletions: list[DeletionEntry]
) -> tuple[list[str], list[str]]:
    """Journal again, in the database file being restored, the forget-me requests and
    message deletions it lacks; their pseudonyms and labels. (In a thread: the command
    may run inside an event loop.)"""
    if not entries and not deletions:
        return [], []

    async def run() -> tuple[list[str], list[str]]:
        db = await open_database(url=None, path=database)
        try:
            forgets = await db.rejournal(entries, datetime.now(UTC)) if entries else []
            return forgets, await db.rejournal_deletions(deletions) if deletions else []
        finally:
            await db.close()

    with ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(asyncio.run, run()).result()


def read_manifest(source: Path) -> dict[str, Any]:
    path = source / MANIFEST
    try:
        manifest = json.loads(path.read_text())
    except FileNotFoundError:
        raise BackupError(f"error: {source} is not a backup: it has no {MANIFEST}") from None
    except (OSError, ValueError) as exc:
        raise BackupError(f"error: cannot read {path} ({exc})") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise BackupError(f"error: {path} is not a backup manifest this release can read")
    return manifest


def verify(source: Path, manifest: dict[str, Any]) -> None:
    """Every file the manifest lists is there, with its size and checksum."""
    for entry in manifest["files"]:
        path = source / entry["path"]
        if not path.is_file():
            raise BackupError(f"error: the backup is incomplete: {path} is missing")
        if path.stat().st_size != entry["bytes"] or _sha256(path) != entry["sha256"]:
            raise BackupError(f"error: the backup is damaged: {path} does not match its checksum")


# ------------------------------------------------------------------------------- lock


def locked_data_dir(data_dir: Path, doing: str) -> DataDirLock:
    """The data directory's lock, or a refusal naming the running bot."""
    try:
        return DataDirLock.acquire(data_dir)
    except StartupError:
        pid = _holder(data_dir)
        who = f"a Sonality Bot (pid {pid})" if pid else "a Sonality Bot"
        raise BackupError(
            f"error: {who} is running with SONALITY_DATA_DIR={data_dir}: stop it first, "
            f"then {doing} (Chroma's files are only consistent while nothing writes them)"
        ) from None


def _holder(data_dir: Path) -> int | None:
    try:
        return int((data_dir / LOCK_FILE).read_text().strip())
    except (OSError, ValueError):
        return None
