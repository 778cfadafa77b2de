"""Everything `python -m app` checks and prepares before the bot itself starts.

Why one module: a newcomer's first mistake is a setting, and every such mistake must
end the same way, with ONE line naming the variable, the value and what is allowed,
and exit code 2, never a traceback. The order matters and is kept here in one place:
settings first (nothing touched yet), then the data directory, then the lock on it
(before anything opens the database or writes the log), then a read-only look at the
database and Chroma's file (a damaged, foreign, too new or read-only file is named now,
not by the first member to write), then logging, then the key and models at the LLM
endpoint, and only then the bot (whose wiring hands every agent the engine's
configuration, `engine_config`). The SDK is imported only for the model check, and
Chroma and the bot only at the last step: a refused setting comes within about a
second, a wrong key or model without loading the memory.
"""

from __future__ import annotations

import asyncio
import os
import re
import sys
import tempfile
import types
import typing
from pathlib import Path
from typing import Any

from pydantic import SecretStr, ValidationError
from pydantic.fields import FieldInfo
from pydantic_settings import SettingsError

from adapters.slack_settings import check_slack_settings
from app import logs, setting_names
from app.lock import installation_locks
from app.preflight import check_models, check_storage
from bot.interface import StartupError
from bot.settings import Settings
from sonality.config import EngineConfig
from storage.platform import KEY_HOWTO

#: Longest value echoed back in an error line (a pasted JSON blob would drown it).
MAX_SHOWN_VALUE = 60


class SettingError(StartupError):
    """A setting the operator must fix, already worded as the one line to print."""


def run() -> int:
    """Start the bot as configured; the exit code (2: the operator must fix something)."""
    try:
        settings = load_settings()
        require_whole_platforms(settings)
        require_llm_key(settings)
        require_secret_key(settings)
        if settings.slack_enabled:
            check_slack_settings(settings)
        prepare_data_dir(settings.data_dir)
        lock = installation_locks(settings.data_dir, _set_apart(settings))
    except StartupError as exc:
        return _refuse(exc)
    with lock:
        try:
            # Under the lock: no other bot can be changing the files while they are read.
            check_storage(settings)
            configure_logging(settings)
            # A wrong key, model or URL is told before Chroma and the bot are loaded.
            asyncio.run(check_models(settings))
        except StartupError as exc:  # a storage, log file or model fault
            return _refuse(exc)
        except KeyboardInterrupt:  # Ctrl-C while a slow endpoint is checked
            return 130
        from app.wiring import run_bot  # heavy (Chroma, the bot): only once the checks passed

        try:
            return asyncio.run(run_bot(settings))
        except StartupError as exc:
            return _refuse(exc)
        except KeyboardInterrupt:
            return 130


def _set_apart(settings: Settings) -> list[tuple[Path, str]]:
    """The files the bot writes that a setting may put outside its data directory."""
    paths = []
    if settings.postgres_url is None:
        paths.append((settings.resolved_database_path, "SONALITY_DATABASE_PATH"))
    if settings.chroma_url is None:
        paths.append((settings.resolved_chroma_dir, "SONALITY_CHROMA_DIR"))
    return paths


def _refuse(exc: StartupError) -> int:
    text = " ".join(str(exc).split())  # one line, whatever the message held
    print(text if text.startswith("error: ") else f"error: {text}", file=sys.stderr, flush=True)
    return 2


def load_settings() -> Settings:
    """`Settings()` from the environment and `.env`, or a `SettingError` naming the first
    bad value (and how many more there are). A name the bot does not know is a warning
    line on stderr, or a `SettingError` with SONALITY_STRICT_SETTINGS=true."""
    try:
        settings = Settings()
    except ValidationError as exc:
        raise SettingError(describe_errors(exc)) from None
    except SettingsError as exc:  # a value pydantic-settings could not even parse (JSON)
        raise SettingError(_describe_source_error(exc)) from None
    check_setting_names(settings)
    return settings


def check_setting_names(settings: Settings) -> None:
    """Warn about (or, strict, refuse) every SONALITY_/DISCORD_/SLACK_ name not read;
    note each removed setting still set."""
    dotenv = setting_names.read_dotenv()
    for name, where in setting_names.removed_names(os.environ, dotenv):
        print(f"note: {setting_names.describe_removed(name, where)}", file=sys.stderr, flush=True)
    unknown = setting_names.unknown_names(os.environ, dotenv)
    if not unknown:
        return
    if settings.strict_settings:
        line = setting_names.describe(*unknown[0], "refused as SONALITY_STRICT_SETTINGS=true")
        if len(unknown) > 1:
            line += f" (and {len(unknown) - 1} more unknown setting(s))"
        raise SettingError(f"error: {line}")
    for name, where in unknown:
        print(
            f"warning: {setting_names.describe(name, where, 'so it is ignored')}",
            file=sys.stderr,
            flush=True,
        )


def describe_errors(exc: ValidationError) -> str:
    errors = exc.errors()
    first = errors[0]
    line = _describe(first)
    if len(errors) > 1:
        line += f" (and {len(errors) - 1} more bad setting(s))"
    return line


def _describe(error: Any) -> str:
    loc = error.get("loc") or ()
    if not loc:
        return f"error: invalid settings: {error.get('msg', '')}"
    variable = str(loc[0])
    field = _field_for(variable)
    shown = _shown_value(error.get("input"), field)
    return f"error: {variable}={shown} is not allowed: {_allowed(error, field)}"


def _field_for(variable: str) -> FieldInfo | None:
    for name, field in Settings.model_fields.items():
        if variable in (name, field.alias):
            return field
    return None


def _shown_value(value: Any, field: FieldInfo | None) -> str:
    if field is not None and SecretStr in _plain_types(field.annotation):
        return "(hidden)"
    text = " ".join(str(value).split()) if isinstance(value, str) else repr(value)
    text = logs.hide_credentials(text)  # a URL's user:password@ is never printed
    return text if len(text) <= MAX_SHOWN_VALUE else text[: MAX_SHOWN_VALUE - 1] + "…"


def _plain_types(annotation: Any) -> tuple[Any, ...]:
    """`float | None` -> (float,); `Literal[...]` stays as it is."""
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union:
        return tuple(a for a in typing.get_args(annotation) if a is not type(None))
    return (annotation,)


def _allowed(error: Any, field: FieldInfo | None) -> str:
    """What the variable accepts, in words, from the field's own type and bounds."""
    if error.get("type") == "value_error":  # one of our validators: its message says it
        return str(error.get("ctx", {}).get("error", error.get("msg", "")))
    if field is None:
        return _lower_first(str(error.get("msg", "invalid value")))
    kinds = _plain_types(field.annotation)
    kind = kinds[0] if len(kinds) == 1 else None
    if typing.get_origin(kind) is typing.Literal:
        return "must be one of " + ", ".join(str(v) for v in typing.get_args(kind))
    if kind is bool:
        return "must be true or false"
    if kind is int or kind is float:
        noun = "a whole number" if kind is int else "a number"
        return f"must be {noun}{_bounds(field)}"
    return _lower_first(str(error.get("msg", "invalid value")))


def _bounds(field: FieldInfo) -> str:
    """The field's ge/gt/le/lt constraints (annotated-types objects in its metadata)."""
    low = high = None
    low_open = high_open = False
    for rule in field.metadata:
        if getattr(rule, "ge", None) is not None:
            low = rule.ge
        elif getattr(rule, "gt", None) is not None:
            low, low_open = rule.gt, True
        if getattr(rule, "le", None) is not None:
            high = rule.le
        elif getattr(rule, "lt", None) is not None:
            high, high_open = rule.lt, True
    if low is not None and high is not None and not (low_open or high_open):
        return f" between {low:g} and {high:g}"
    parts = []
    if low is not None:
        parts.append(f"greater than {low:g}" if low_open else f"at least {low:g}")
    if high is not None:
        parts.append(f"less than {high:g}" if high_open else f"at most {high:g}")
    return (", " + " and ".join(parts)) if parts else ""


def _lower_first(text: str) -> str:
    return text[:1].lower() + text[1:]


def _describe_source_error(exc: SettingsError) -> str:
    match = re.search(r'field "([^"]+)"', str(exc))
    field = Settings.model_fields.get(match.group(1)) if match else None
    variable = field.alias if field is not None and field.alias else "a setting"
    return f"error: {variable} is not allowed: must be valid JSON ({exc})"


def require_whole_platforms(settings: Settings) -> None:
    """A platform given some of its settings but not the one that turns it on is a
    mistake, not a request for the terminal: under systemd or Docker the terminal
    community would read an empty stdin and exit 0, looking like a clean stop."""
    for enabler, on, prefix in (
        ("DISCORD_TOKEN", settings.discord_enabled, "DISCORD_"),
        ("SLACK_BOT_TOKEN", settings.slack_enabled, "SLACK_"),
    ):
        given = sorted(
            field.alias
            for name, field in Settings.model_fields.items()
            if name in settings.model_fields_set and field.alias and field.alias.startswith(prefix)
        )
        if given and not on:
            also = " (or SLACK_CLIENT_ID for many workspaces)" if prefix == "SLACK_" else ""
            raise SettingError(
                f"error: {', '.join(given)} {'is' if len(given) == 1 else 'are'} set but "
                f"{enabler} is not: set {enabler}{also} to run on "
                f"{prefix.strip('_').title()}, or remove the {prefix}* settings to chat "
                "in the terminal"
            )


def require_secret_key(settings: Settings) -> None:
    """Multi-workspace Slack stores a bot token per workspace: never in plain text."""
    if settings.slack_enabled and settings.slack_oauth and settings.secret_key is None:
        raise StartupError(
            f"Slack OAuth (SLACK_CLIENT_ID) stores workspace tokens and needs "
            f"SONALITY_SECRET_KEY to encrypt them; {KEY_HOWTO}"
        )


def require_llm_key(settings: Settings) -> None:
    """Only Anthropic cannot work without a key; an OpenAI-compatible server may take
    none (Ollama), and one that wants one answers 401, which the start-up check names."""
    if settings.llm_provider != "anthropic":
        return
    key = settings.anthropic_api_key
    if key is None or not key.get_secret_value().strip():
        raise SettingError(
            "error: set ANTHROPIC_API_KEY (in the environment or in .env) to run the bot "
            "with SONALITY_LLM_PROVIDER=anthropic (the default), or set "
            "SONALITY_LLM_PROVIDER=openai for an OpenAI-compatible server."
        )


def prepare_data_dir(path: Path) -> None:
    """Create the data directory if missing and prove it is writable, so a wrong path
    is named now rather than as a traceback from SQLite or Chroma later."""
    where = f"SONALITY_DATA_DIR={path}"
    if path.exists() and not path.is_dir():
        raise SettingError(f"error: {where} is not allowed: it is a file, not a directory")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise SettingError(
            f"error: {where} is not allowed: the directory cannot be created ({exc.strerror})"
        ) from None
    try:
        with tempfile.TemporaryFile(dir=path):
            pass
    except OSError as exc:
        raise SettingError(
            f"error: {where} is not allowed: the directory is not writable ({exc.strerror}); "
            f"make it writable for uid {os.geteuid()} or choose another directory"
        ) from None


def configure_logging(settings: Settings) -> None:
    """stdout, or (terminal community) warnings on stderr; a rotated file if named."""
    logs.configure_logging(
        level=settings.log_level,
        # In the terminal community, chat owns the screen: only problems go to stderr.
        interactive_terminal=not (settings.discord_enabled or settings.slack_enabled),
        log_file=settings.log_file,
        max_bytes=settings.log_file_max_bytes,
        backups=settings.log_file_backups,
        log_format=settings.log_format,
    )


def engine_config(settings: Settings) -> EngineConfig:
    """The engine's tunables from the validated settings, built once by the host and
    handed to every agent (the settings and the engine share the bounds, so a value
    the settings accepted is never refused here)."""
    return EngineConfig(
        model=settings.model,
        ess_model=settings.ess_model,
        ess_threshold=settings.ess_threshold,
        bootstrap_dampening_until=settings.bootstrap_dampening_until,
        opinion_cooling_period=settings.opinion_cooling_period,
        semantic_retrieval_count=settings.semantic_retrieval_count,
        episodic_retrieval_count=settings.episodic_retrieval_count,
        reflection_every=settings.reflection_every,
    )
