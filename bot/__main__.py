"""`python -m bot`: start every configured platform, or the terminal community.

The checks that come before the bot (settings, data directory, its lock) live in
`bot/startup.py` and the command line in `bot/cli.py`; this stays a short dispatch.

Every file the program creates is its user's alone: the data directory, the databases,
Chroma's files, the log, backups and exported files hold members' words, and the usual
umask (022) would leave them readable by every account on the machine.
"""

from __future__ import annotations

import os
import sys

from bot.backup import COMMANDS as BACKUP_COMMANDS
from bot.backup import run_command as run_backup_command
from bot.cli import HEALTHCHECK_COMMAND, parse_args
from bot.migrate import COMMAND as MIGRATE_COMMAND
from bot.migrate import run_command as run_migrate_command
from bot.startup import run

#: Files 0600 and directories 0700, whatever umask the program was started with.
PRIVATE_UMASK = 0o077


def main(argv: list[str] | None = None) -> int:
    os.umask(PRIVATE_UMASK)  # first, before anything (a log, a lock, a backup) is created
    args = sys.argv[1:] if argv is None else argv
    if args[:1] == ["evaluate"]:  # a command line of its own: bot/evaluate/cli.py
        from bot.evaluate.cli import main as evaluate

        return evaluate(args[1:])
    parsed = parse_args(argv)  # --help and usage errors end here, before anything starts
    if parsed.command in BACKUP_COMMANDS:  # backup / restore: bot/backup.py
        return run_backup_command(parsed)
    if parsed.command == MIGRATE_COMMAND:  # SQLite + local Chroma -> servers: bot/migrate.py
        return run_migrate_command(parsed)
    if parsed.command == HEALTHCHECK_COMMAND:  # ask the running bot's /healthz
        from bot.healthcheck import main as healthcheck

        return healthcheck()
    return run()


if __name__ == "__main__":
    sys.exit(main())
