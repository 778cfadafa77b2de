"""`python -m app` command line: what `--help` shows and which command runs.

Why argparse with subcommands although there is one command today: `--help` must
answer without starting anything, an unknown option must be a usage error (exit 2)
rather than silently ignored, and further commands (an `evaluate`, say) slot in as
`commands.add_parser(...)` next to `run` without changing how `python -m app` alone
behaves (it still runs the bot).

The settings listed in the help take their defaults from `Settings` itself, so the
help cannot drift from what the bot does.
"""

from __future__ import annotations

import argparse

from app.backup import add_commands as add_backup_commands
from app.chroma_log_command import add_command as add_chroma_log_command
from app.invocation import program
from app.move_data import add_command as add_migrate_command
from bot.settings import Settings

#: `healthcheck`: app/healthcheck.py, also run alone by the container's HEALTHCHECK.
HEALTHCHECK_COMMAND = "healthcheck"

#: (variable, what it does) for the help; the default comes from `Settings`.
MAIN_SETTINGS: tuple[tuple[str, str], ...] = (
    ("SONALITY_LLM_PROVIDER", "anthropic, or openai (any OpenAI-compatible server)"),
    ("ANTHROPIC_API_KEY", "required with the anthropic provider"),
    ("OPENAI_BASE_URL", "OpenAI-compatible server (e.g. Ollama's .../v1)"),
    ("SONALITY_MODEL", "reply model (unset: the provider's default)"),
    ("SONALITY_ESS_MODEL", "evidence, insight and reflection model"),
    ("SONALITY_DATA_DIR", "database, memories, model; one bot each"),
    ("SONALITY_ESS_THRESHOLD", "evidence (0 to 1) needed to move an opinion"),
    ("SONALITY_REFLECTION_EVERY", "reflect every N interactions"),
    ("SONALITY_TIMEZONE", "IANA time zone of the nightly run and the day"),
    ("SONALITY_NIGHTLY_HOUR", "hour of the nightly reflection"),
    ("SONALITY_NIGHTLY_TIME", "or its time, HH:MM (instead of the hour)"),
    ("SONALITY_RATE_LIMIT_MESSAGES", "per member and window (Discord, Slack)"),
    ("SONALITY_DAILY_BUDGET_USD", "daily spending limit per community"),
    ("SONALITY_LOG_LEVEL", "DEBUG, INFO, WARNING, ERROR or CRITICAL"),
    ("SONALITY_LOG_FILE", "also log to this file, rotated (unset: stdout only)"),
    ("SONALITY_LOG_FORMAT", "text, or json: one JSON object per line"),
)

MODES = """\
modes (chosen by which settings are set; Discord and Slack can run side by side):
  terminal   neither of the below: a local community in this terminal, where you are
             a moderator; with stdin not a terminal, one message per line in and one
             answer per line out
  Discord    DISCORD_TOKEN is set
  Slack      SLACK_BOT_TOKEN is set (one workspace), or SLACK_CLIENT_ID and
             SLACK_CLIENT_SECRET (many workspaces); SLACK_APP_TOKEN for Socket Mode"""


def _default(variable: str) -> str:
    for field in Settings.model_fields.values():
        if field.alias == variable:
            value = field.get_default(call_default_factory=True)
            return "unset" if value in (None, "", {}) else str(value)
    return "unset"


def _settings_help() -> str:
    name_width = max(len(name) for name, _ in MAIN_SETTINGS)
    defaults = {name: _default(name) for name, _ in MAIN_SETTINGS}
    value_width = max(len(v) for v in defaults.values())
    rows = [
        f"  {name:<{name_width}}  {defaults[name]:<{value_width}}  {meaning}"
        for name, meaning in MAIN_SETTINGS
    ]
    return (
        "main settings (environment or .env; .env.example lists them all) and defaults:\n"
        + "\n".join(rows)
    )


def build_parser() -> tuple[
    argparse.ArgumentParser, argparse._SubParsersAction[argparse.ArgumentParser]
]:
    """The parser and its subcommand group, to which further commands are added."""
    parser = argparse.ArgumentParser(
        prog=program(),
        description="Sonality Bot: an AI personality per community that changes its mind\n"
        "only for good reasons. Without a command, runs the bot.",
        epilog=f"{MODES}\n\n{_settings_help()}",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    commands = parser.add_subparsers(dest="command", metavar="[COMMAND]", title="commands")
    commands.add_parser(
        "run", help="run the bot (the default)", description="Run the bot until stopped."
    )
    # Parsed by its own command line (evaluate/command.py); listed here for --help.
    commands.add_parser(
        "evaluate",
        help="measure how well the configured models hold their views (see evaluate --help)",
    )
    add_backup_commands(commands)  # backup DEST, restore SOURCE (app/backup.py)
    add_migrate_command(commands)  # migrate --to-database URL --to-chroma URL (app/move_data.py)
    add_chroma_log_command(commands)  # index-chroma-log PATH (app/chroma_log_command.py)
    commands.add_parser(
        HEALTHCHECK_COMMAND,
        help="ask the running bot's /healthz (exit 0 healthy, 1 not)",
        description="Ask the health endpoint (SONALITY_HEALTH_PORT, SONALITY_HEALTH_HOST) "
        "and print its answer; exit 0 when healthy or when the endpoint is off, 1 when not.",
    )
    return parser, commands


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Parsed arguments; `--help` exits 0 and a bad option exits 2, as argparse does."""
    parser, _ = build_parser()
    args = parser.parse_args(argv)
    args.command = args.command or "run"
    return args
