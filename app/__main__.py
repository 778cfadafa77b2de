"""`python -m app`: start every configured platform, or the terminal community.

The checks that come before the bot (settings, data directory, its lock) live in
`app/startup.py` and the command line in `app/cli.py`; this stays a short dispatch.

Every file the program creates is its user's alone: the data directory, the databases,
Chroma's files, the log, backups and exported files hold members' words, and the usual
umask (022) would leave them readable by every account on the machine. For the same
reason the program starts once more under glibc settings that keep freed memory out of
Chroma's files (sonality/memory/freed_memory.py), before it loads its modules: those
are most of a start-up, and are imported in `main`.
"""

from __future__ import annotations

import os
import sys

from sonality.memory.freed_memory import restart_scrubbed

#: Files 0600 and directories 0700, whatever umask the program was started with.
PRIVATE_UMASK = 0o077


def main(argv: list[str] | None = None) -> int:
    os.umask(PRIVATE_UMASK)  # first, before anything (a log, a lock, a backup) is created
    args = sys.argv[1:] if argv is None else argv
    if args[:1] == ["evaluate"]:
        # A program of its own, a layer above this one (evaluate/command.py): handed
        # over as a process, so nothing here imports it.
        os.execv(sys.executable, [sys.executable, "-m", "evaluate", *args[1:]])
    from app.backup import COMMANDS as BACKUP_COMMANDS
    from app.backup import run_command as run_backup_command
    from app.chroma_log_command import COMMAND as CHROMA_LOG_COMMAND
    from app.chroma_log_command import run_command as run_chroma_log_command
    from app.cli import HEALTHCHECK_COMMAND, parse_args
    from app.move_data import COMMAND as MIGRATE_COMMAND
    from app.move_data import run_command as run_migrate_command
    from app.startup import run

    parsed = parse_args(argv)  # --help and usage errors end here, before anything starts
    if parsed.command in BACKUP_COMMANDS:  # backup / restore: app/backup.py
        return run_backup_command(parsed)
    if parsed.command == MIGRATE_COMMAND:  # SQLite + local Chroma -> servers: app/move_data.py
        return run_migrate_command(parsed)
    if parsed.command == CHROMA_LOG_COMMAND:  # a Chroma server's files: app/chroma_log_command.py
        return run_chroma_log_command(parsed)
    if parsed.command == HEALTHCHECK_COMMAND:  # ask the running bot's /healthz
        from app.healthcheck import main as healthcheck

        return healthcheck()
    return run()


if __name__ == "__main__":
    restart_scrubbed()  # the same command again, once, unless it already runs scrubbed
    sys.exit(main())
