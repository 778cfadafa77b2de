"""`python -m app migrate --to-database postgresql://... --to-chroma http://host:port`.

Moves one installation (the SQLite file and the local Chroma directory of the current
settings) onto PostgreSQL and a Chroma server, so that several bot processes can share
it. The source is only read (after the schema upgrade its next start would make anyway)
and the bot must be stopped: the command takes the data directory's lock, as `backup`
does, so nothing writes while it copies.

Why it is safe to run again: the database copy marks the target while it runs (see
`storage.transfer`), and a second run of the same copy writes everything again as
upserts, episodes included. A target holding anything else is refused in one line.
The state goes first and the episodes second; the mark is removed only when both have
been checked, so an interrupted run never leaves a target that looks finished.
"""

from __future__ import annotations

import argparse
import asyncio
import sys

from app.backup import BackupError, locked_data_dir
from bot.interface import StartupError
from bot.settings import Settings
from storage import transfer
from storage.models import StorageError
from storage.postgres import describe_url, is_postgres_url

COMMAND = "migrate"


class MigrateError(StartupError):
    """Why the migration stopped, as the one line to print (exit code 2)."""


def add_command(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register `migrate` in `python -m app`'s command line."""
    cmd = commands.add_parser(
        COMMAND,
        help="copy this installation into PostgreSQL and a Chroma server (stop the bot first)",
        description="Copy every row of the SQLite database (SONALITY_DATA_DIR) into an "
        "empty PostgreSQL database, and every memory of the local Chroma directory, "
        "vectors included, into a Chroma server. The bot must be stopped. Safe to run "
        "again after a failure. Afterwards set DATABASE_URL and CHROMA_URL to the same "
        "addresses (and keep SONALITY_SECRET_KEY) and start the bot.",
    )
    cmd.add_argument(
        "--to-database", required=True, metavar="URL", help="postgresql://user:pass@host:port/db"
    )
    cmd.add_argument(
        "--to-chroma",
        metavar="URL",
        help="http://host:port of a `chroma run` server (left out: memories stay local)",
    )
    cmd.add_argument(
        "--chroma-database",
        metavar="NAME",
        help="database on the Chroma server (default: SONALITY_CHROMA_DATABASE)",
    )


def run_command(args: argparse.Namespace) -> int:
    from app.startup import load_settings

    try:
        settings = load_settings()
        for line in migrate(settings, args.to_database, args.to_chroma, args.chroma_database):
            print(line, flush=True)
    except StartupError as exc:
        text = " ".join(str(exc).split())
        print(text if text.startswith("error: ") else f"error: {text}", file=sys.stderr)
        return 2
    return 0


def migrate(
    settings: Settings, database_url: str, chroma_url: str | None, chroma_database: str | None
) -> list[str]:
    """Copy, check, and return the lines that say what was copied."""
    if settings.postgres_url is not None or settings.chroma_url is not None:
        raise MigrateError(
            "migrate copies the SQLite file and the local Chroma directory: unset "
            "DATABASE_URL and CHROMA_URL while it runs (give the targets as options)"
        )
    if not is_postgres_url(database_url):
        raise MigrateError("--to-database must be a postgresql://... URL")
    source = settings.resolved_database_path
    if not source.is_file():
        raise MigrateError(
            f"there is no database at {source} (SONALITY_DATA_DIR={settings.data_dir}): "
            "nothing to migrate"
        )
    where = describe_url(database_url)
    lines: list[str] = []
    try:
        lock = locked_data_dir(settings.data_dir, "migrate")
    except BackupError as exc:
        raise MigrateError(str(exc)) from None
    with lock:
        try:
            asyncio.run(transfer.prepare(source, database_url))
            resumed = transfer.begin(source, database_url)
            if resumed:
                lines.append(f"resuming the unfinished copy into PostgreSQL at {where}")
            copies = transfer.copy_tables(source, database_url)
            for copy in copies:
                lines.append(f"  {copy.name}: {copy.rows} rows")
            report = transfer.check(source, database_url, copies, resumed)
        except StorageError as exc:
            raise MigrateError(str(exc)) from None
        lines.append(
            f"copied {report.rows} rows of {len(report.tables)} tables to PostgreSQL at "
            f"{where}: {report.communities} communities, each community's newest version "
            "checked"
        )
        if chroma_url is not None:
            lines += _episodes(settings, chroma_url, chroma_database, resumed)
        else:
            lines.append(f"memories stay in {settings.resolved_chroma_dir} (no --to-chroma)")
        try:
            transfer.finish(database_url)
        except StorageError as exc:
            raise MigrateError(str(exc)) from None
    lines.append(
        "done: set DATABASE_URL"
        + (" and CHROMA_URL" if chroma_url else "")
        + ", then start the bot"
    )
    return lines


def _episodes(settings: Settings, url: str, database: str | None, resumed: bool) -> list[str]:
    from chroma_memory.collection_copy import EpisodesRefused, copy_episodes
    from chroma_memory.embedding import default_embedding_function
    from chroma_memory.server import ServerChroma, ServerUnreachable

    name = database or settings.chroma_database
    try:
        target = ServerChroma(url, database=name, timeout=settings.chroma_timeout_seconds)
    except ServerUnreachable as exc:
        raise MigrateError(f"could not reach the Chroma server {url} ({exc})") from None
    try:
        embed = default_embedding_function(
            settings.resolved_model_cache_dir, quantized=settings.embedding_int8
        )
        copies = copy_episodes(settings.resolved_chroma_dir, target, embed, resume=resumed)
    except EpisodesRefused as exc:
        raise MigrateError(str(exc)) from None
    except Exception as exc:  # the server went away, a check failed: say so, re-run later
        raise MigrateError(
            f"copying memories to {url} failed ({type(exc).__name__}: {exc}); "
            "run the same command again to finish"
        ) from None
    finally:
        target.close()
    lines = [f"  {c.name}: {c.records} memories" for c in copies]
    lines.append(
        f"copied {sum(c.records for c in copies)} memories in {len(copies)} collections to "
        f"the Chroma server at {url} (database {name}), vectors as they were"
    )
    return lines
