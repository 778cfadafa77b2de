"""`python -m app index-chroma-log PATH`: index a Chroma server's write log.

The bot indexes its embedded Chroma's log itself at every start (storage/chroma_log.py).
A Chroma server's files are on the server's machine, and the bot reaches the server only
over HTTP, so the server's operator runs this once where the files are, with the path
the server was started with. Without the index every write the server takes and every
index it loads reads through all the other communities' unsaved writes
(docs/scaling.md has the figures). It is safe while the server runs: SQLite holds its
write lock only while the index is built, and Chroma prepares its statements again
after a schema change. Running it again changes nothing.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from storage.chroma_log import index_chroma_log

COMMAND = "index-chroma-log"


def add_command(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register `index-chroma-log` in `python -m app`'s command line."""
    cmd = commands.add_parser(
        COMMAND,
        help="index a Chroma server's write log by collection (once, where its files are)",
        description="Add the index the bot keeps on its own Chroma's write log to the "
        "chroma.sqlite3 of a Chroma server's directory, so its writes and index loads "
        "stop reading every other community's unsaved writes. Safe while the server "
        "runs, and to run again.",
    )
    cmd.add_argument(
        "path", metavar="PATH", type=Path, help="the directory given to `chroma run --path`"
    )


def run_command(args: argparse.Namespace) -> int:
    """0 when the index is there, 1 when the file would not take it, 2 for a wrong path."""
    database = Path(args.path) / "chroma.sqlite3"
    if not database.is_file():
        print(
            f"{COMMAND}: no chroma.sqlite3 in {args.path}; give the directory the Chroma "
            "server was started with (chroma run --path)",
            file=sys.stderr,
        )
        return 2
    if not index_chroma_log(database.parent):
        print(
            f"{COMMAND}: {database} was left as it was (the warning above says why)",
            file=sys.stderr,
        )
        return 1
    print(f"Chroma's write log in {database} is indexed by collection")
    return 0
