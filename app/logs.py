"""Where the bot's log goes, and in what shape.

Why stdout by default: container platforms (Docker, Kubernetes, systemd, Fly, ...)
collect a process's stdout and rotate it themselves; a file inside the data directory
would grow unseen and fill a volume. A file is written only when SONALITY_LOG_FILE
names one, and then it is rotated by size (SONALITY_LOG_FILE_MAX_BYTES, keeping
SONALITY_LOG_FILE_BACKUPS old files), so it cannot fill a disk either.

The terminal community is the exception: there chat owns the screen (and, scripted,
stdout carries exactly one answer line per input line), so only warnings and errors
reach the console, on stderr, and everything else goes to the file if one is set.

SONALITY_LOG_FORMAT=json writes one JSON object per line (time, level, logger,
message, and the community when the line is about one) for log shippers, which
otherwise have to guess where a multi-line traceback ends.

Routine work stays out of INFO: APScheduler announces every run of the once-a-minute
housekeeping job at INFO; it is moved to WARNING unless SONALITY_LOG_LEVEL=DEBUG asks
for everything.

The libraries the bot talks through never log at DEBUG, even at SONALITY_LOG_LEVEL=DEBUG:
there they dump every request and event whole (the model SDKs each prompt, with members'
words, names and memories; discord.py every message it receives and sends). Their INFO
notices (connected, retrying) stay; the libraries that print request bodies or
statement parameters below WARNING (Bolt, aiosqlite) and the HTTP clients' line per
request are kept at WARNING. The bot's own DEBUG lines name ids and sizes, never what a
member wrote, so DEBUG is safe to turn on to look into a problem.

No line shows the `user:password@` of a URL (`hide_credentials`): OPENAI_BASE_URL or
ANTHROPIC_BASE_URL may carry a proxy's credentials, and the model clients name their
endpoint in their errors and notices, so every line is scrubbed as it is formatted.
"""

from __future__ import annotations

import json
import logging
import logging.handlers
import re
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Literal

from bot.interface import StartupError

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
#: Loggers that report routine work at INFO (every job run): shown only at DEBUG.
ROUTINE_LOGGERS = ("apscheduler",)
#: Libraries whose DEBUG lines are whole requests, events or prompts (the model SDKs,
#: discord.py, Slack's socket client, Chroma) and whose INFO lines are notices an
#: operator wants (connected, resumed, retrying): never below INFO.
LIBRARY_LOGGERS = (
    "anthropic",
    "openai",
    "discord",
    "slack_sdk",
    "chromadb",
    "aiohttp",
    "websockets",
)
#: Libraries that log every request at INFO or DEBUG, some with its body (Bolt prints
#: request bodies at INFO, aiosqlite each statement's parameters at DEBUG): WARNING.
QUIET_LOGGERS = ("httpx", "httpcore", "httpx2", "httpcore2", "slack_bolt", "aiosqlite")
#: The `extra` key that names the community a line is about (a personality's id), as in
#: `log.info(..., extra={"community": community_id})`; JSON lines carry it as a field.
COMMUNITY = "community"

#: The credentials of a URL: what lies between `scheme://` and the last `@` before the
#: host ends (a password with an unescaped `@` included); a quote or space ends the URL.
_URL_CREDENTIALS = re.compile(r"(\b[A-Za-z][A-Za-z0-9+.-]*://)[^\s/?#\"<>]*@")


def hide_credentials(text: str) -> str:
    """`text` with the `user:password@` (or `token@`) of every URL in it replaced by
    `***@`, as a log line, an error or /healthz may show a configured endpoint."""
    if "@" not in text:
        return text
    return _URL_CREDENTIALS.sub(r"\1***@", text)


class TextFormatter(logging.Formatter):
    """The plain text line (`TEXT_FORMAT`), without a URL's credentials."""

    def format(self, record: logging.LogRecord) -> str:
        return hide_credentials(super().format(record))


class JsonFormatter(logging.Formatter):
    """One JSON object per record, on one line (a traceback travels inside it), without
    a URL's credentials."""

    def format(self, record: logging.LogRecord) -> str:
        return hide_credentials(self._entry(record))

    def _entry(self, record: logging.LogRecord) -> str:
        entry: dict[str, object] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        community = getattr(record, COMMUNITY, None)
        if community is not None:
            entry[COMMUNITY] = str(community)
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        elif record.exc_text:
            entry["exception"] = record.exc_text
        if record.stack_info:
            entry["stack"] = self.formatStack(record.stack_info)
        # ensure_ascii: a lone surrogate in a message is escaped, never a write error.
        return json.dumps(entry, ensure_ascii=True, default=str)


def configure_logging(
    *,
    level: str,
    interactive_terminal: bool,
    log_file: Path | None = None,
    max_bytes: int = 10 * 1024 * 1024,
    backups: int = 5,
    log_format: Literal["text", "json"] = "text",
) -> None:
    """Replace the root logger's handlers as the settings say (see the module docstring).

    Raises `StartupError` naming SONALITY_LOG_FILE when that file cannot be opened.
    """
    formatter: logging.Formatter = (
        JsonFormatter() if log_format == "json" else TextFormatter(TEXT_FORMAT)
    )
    handlers: list[logging.Handler] = []
    if interactive_terminal:
        console = logging.StreamHandler(sys.stderr)
        console.setLevel(logging.WARNING)
    else:
        console = logging.StreamHandler(sys.stdout)
    handlers.append(console)
    if log_file is not None:
        handlers.append(_rotating_file(log_file, max_bytes, backups))
    for handler in handlers:
        handler.setFormatter(formatter)
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
        old.close()
    for handler in handlers:
        root.addHandler(handler)
    root.setLevel(level)
    routine = logging.DEBUG if level == "DEBUG" else logging.WARNING
    for name in ROUTINE_LOGGERS:
        logging.getLogger(name).setLevel(routine)
    for name in LIBRARY_LOGGERS:
        logging.getLogger(name).setLevel(max(root.level, logging.INFO))
    for name in QUIET_LOGGERS:
        logging.getLogger(name).setLevel(logging.WARNING)


def _rotating_file(path: Path, max_bytes: int, backups: int) -> logging.Handler:
    where = f"SONALITY_LOG_FILE={path}"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        return logging.handlers.RotatingFileHandler(
            path, maxBytes=max_bytes, backupCount=backups, encoding="utf-8", errors="replace"
        )
    except IsADirectoryError:
        raise StartupError(f"error: {where} is not allowed: it is a directory") from None
    except OSError as exc:
        raise StartupError(
            f"error: {where} is not allowed: the file cannot be opened ({exc.strerror})"
        ) from None
