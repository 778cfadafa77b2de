"""The start-up model check: one cheap request per configured model, before any platform.

Why: a rejected key, a misspelt model or a wrong URL otherwise shows up only when the
first member writes, as a notice in the chat and a log line nobody reads, and on
Discord or Slack the bot looks alive meanwhile. Checked first, the bot refuses to start
with ONE line naming the setting to fix.

Why a fault of the moment only warns: a 429, a 5xx or Anthropic's 529 says nothing about
the configuration, and a bot that will not start during a vendor's bad minute is worse
than one that starts and retries per message.

The check uses its own short-lived SDK client with one retry and a short timeout, so a
dead endpoint costs seconds, not the minutes the chat client would patiently wait.

An endpoint is named without the `user:password@` its URL may carry (a proxy's
credentials in OPENAI_BASE_URL or ANTHROPIC_BASE_URL): the lines here reach the log and
the terminal.
"""

from __future__ import annotations

import errno
import logging
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from app.logs import hide_credentials
from bot.interface import StartupError
from bot.settings import Settings
from providers import connection_failure, is_local_endpoint
from storage.migrations import SCHEMA_VERSION
from storage.models import SchemaTooNewError, StorageError
from storage.postgres import check_postgres, describe_url
from storage.probe import probe_database, probe_sqlite_file

log = logging.getLogger(__name__)

CHECK_TIMEOUT_SECONDS = 10.0
CHECK_RETRIES = 1
ANTHROPIC_API_URL = "https://api.anthropic.com"
CHROMA_FILE = "chroma.sqlite3"


@dataclass(frozen=True)
class _Endpoint:
    """What the one-line messages name: the settings an operator would edit."""

    key_setting: str
    url_setting: str
    url: str | None  # as configured; None: the vendor's own
    default_url: str
    has_key: bool

    @property
    def where(self) -> str:
        return hide_credentials(self.url or self.default_url)

    @property
    def url_named(self) -> str:
        if self.url:
            return f"{self.url_setting}={hide_credentials(self.url)}"
        return f"{self.default_url} ({self.url_setting} unset)"


async def check_models(settings: Settings) -> None:
    """Raise `StartupError` if the key, a model or the endpoint is wrong; log a WARNING
    and return if the endpoint only failed for the moment. Says (INFO) which timeout
    the bot's calls will have, since a local model may need far longer than the check."""
    log.info(timeout_line(settings))
    models: dict[str, list[str]] = {}
    models.setdefault(settings.model, []).append("SONALITY_MODEL")
    models.setdefault(settings.ess_model, []).append("SONALITY_ESS_MODEL")
    if settings.llm_provider == "openai":
        await _check_openai(settings, models)
    else:
        await _check_anthropic(settings, models)


def timeout_line(settings: Settings) -> str:
    """Which LLM timeout is in force, and why (the setting, or the kind of endpoint)."""
    if settings.llm_timeout_seconds is not None:
        why = "SONALITY_LLM_TIMEOUT_SECONDS"
    elif is_local_endpoint(settings.llm_base_url):
        where = hide_credentials(settings.llm_base_url or "")
        why = f"the default for a local endpoint ({where})"
    else:
        why = "the default for a hosted API; SONALITY_LLM_TIMEOUT_SECONDS changes it"
    return f"LLM calls time out after {settings.llm_timeout:g}s ({why})"


async def _check_anthropic(settings: Settings, models: dict[str, list[str]]) -> None:
    import anthropic  # here, not at the top: a refused setting or --help ends sooner

    key = settings.anthropic_api_key.get_secret_value() if settings.anthropic_api_key else ""
    if not key:
        return  # `build_llm` refuses to start without one, naming ANTHROPIC_API_KEY
    endpoint = _Endpoint(
        key_setting="ANTHROPIC_API_KEY",
        url_setting="ANTHROPIC_BASE_URL",
        url=settings.anthropic_base_url,
        default_url=ANTHROPIC_API_URL,
        has_key=True,
    )
    async with anthropic.AsyncAnthropic(
        api_key=key,
        base_url=settings.anthropic_base_url,
        max_retries=CHECK_RETRIES,
        timeout=CHECK_TIMEOUT_SECONDS,
    ) as client:
        for model, names in models.items():
            try:
                await client.models.retrieve(model)
            except anthropic.AnthropicError as err:
                _judge(anthropic, err, endpoint, model, names)


async def _check_openai(settings: Settings, models: dict[str, list[str]]) -> None:
    import openai

    from providers.openai import OPENAI_API_URL, OpenAILLM

    key = settings.openai_api_key.get_secret_value() if settings.openai_api_key else ""
    client = OpenAILLM(
        api_key=key,
        base_url=settings.openai_base_url,
        default_model=settings.model,
        max_retries=CHECK_RETRIES,
        timeout=CHECK_TIMEOUT_SECONDS,
        max_concurrency=1,
    )
    endpoint = _Endpoint(
        key_setting="OPENAI_API_KEY",
        url_setting="OPENAI_BASE_URL",
        url=settings.openai_base_url,
        default_url=OPENAI_API_URL,
        has_key=client.has_key,
    )
    try:
        for model, names in models.items():
            try:
                await client.check_model(model)
            except openai.OpenAIError as err:
                _judge(openai, err, endpoint, model, names)
    finally:
        await client.aclose()


def _judge(
    sdk: ModuleType, err: Exception, endpoint: _Endpoint, model: str, names: list[str]
) -> None:
    """Raise `StartupError` for what the operator must fix; warn about the rest. `sdk`
    is the vendor's SDK module: both name their error classes alike, and the OpenAI one
    is imported only when it is the provider (about 13 MB an Anthropic bot never needs)."""
    setting = f"{names[0]}={model}" + (f" (also {', '.join(names[1:])})" if names[1:] else "")
    refused = connection_failure(err)
    if refused is not None or (
        isinstance(err, sdk.APIConnectionError) and not isinstance(err, sdk.APITimeoutError)
    ):
        why = refused or "connection error"
        raise StartupError(f"could not reach {endpoint.url_named} ({why})")
    if isinstance(err, sdk.APIStatusError):
        status = err.status_code
        if status in (401, 403):
            if not endpoint.has_key:
                raise StartupError(
                    f"{endpoint.where} wants an API key ({status}): set {endpoint.key_setting}"
                )
            key = endpoint.key_setting
            raise StartupError(f"{key} was rejected by {endpoint.where} ({status})")
        if status == 404 and _about_model(err, model):
            raise StartupError(
                f"{setting} is not a model this endpoint knows ({endpoint.where}, 404)"
            )
    log.warning(
        "could not check model %s at %s (%s); starting anyway",
        model,
        endpoint.where,
        _short(sdk, err),
    )


def _about_model(err: Any, model: str) -> bool:
    """A 404 that names the model, not one for a path a proxy does not serve."""
    body = err.body
    if isinstance(body, dict) and isinstance(body.get("error"), dict):
        body = body["error"]
    if isinstance(body, dict):
        if body.get("code") == "model_not_found":
            return True
        return model in str(body.get("message", ""))
    return False


def _short(sdk: ModuleType, err: Exception) -> str:
    if isinstance(err, sdk.APITimeoutError):
        return f"no answer within {CHECK_TIMEOUT_SECONDS:g}s"
    if isinstance(err, sdk.APIStatusError):
        return f"status {err.status_code}"
    return f"{type(err).__name__}: {hide_credentials(str(err))[:120]}"


# --- storage ---------------------------------------------------------------------------
#
# Why before any member is answered: a read-only database otherwise lets the bot start,
# answer every message "Sorry, something went wrong" and keep writing Chroma files; a
# damaged or foreign file ends in a traceback part-way through opening. Every check here
# only reads (or creates and removes a temporary file of its own), so nothing the
# operator has is ever changed, and each fault is one line saying what to do.


def check_storage(settings: Settings) -> None:
    """Raise `StartupError` if the database or Chroma's files cannot be used as they are."""
    if settings.postgres_url is not None:
        _check_postgres(settings.postgres_url)
    else:
        _check_sqlite(settings)
    if settings.chroma_url is not None:
        return  # episodes live in a Chroma server; reaching it is checked as it opens
    chroma_dir = settings.resolved_chroma_dir
    chroma_setting = "SONALITY_CHROMA_DIR" if settings.chroma_dir else "SONALITY_DATA_DIR"
    if chroma_dir.exists() and not chroma_dir.is_dir():
        raise StartupError(
            f"Chroma's directory {chroma_dir} is a file; move it away or set {chroma_setting}"
        )
    chroma_file = chroma_dir / CHROMA_FILE
    _check_place(chroma_file, "Chroma's file", chroma_setting)
    if chroma_file.is_file():
        try:
            probe_sqlite_file(chroma_file)
        except StorageError as exc:
            raise StartupError(
                f"Chroma's file {exc}; nothing was changed: restore {chroma_dir} from a "
                "backup (the members' remembered episodes live there)"
            ) from None


def _check_sqlite(settings: Settings) -> None:
    database = settings.resolved_database_path
    db_setting = "SONALITY_DATABASE_PATH" if settings.database_path else "SONALITY_DATA_DIR"
    _check_place(database, "the database", db_setting)
    if database.is_file():
        try:
            probe_database(database)
        except SchemaTooNewError as exc:
            raise StartupError(f"the database {exc}") from None
        except StorageError as exc:
            raise StartupError(
                f"the database {exc}; nothing was changed: restore it from a backup, or "
                f"point {db_setting} elsewhere to start with an empty one"
            ) from None


def _check_postgres(url: str) -> None:
    """DATABASE_URL: the server answers and holds no schema newer than this bot's. Only
    reads; an empty database is fine (the first start creates the tables)."""
    try:
        version = check_postgres(url)
    except StorageError as exc:
        raise StartupError(f"the database: {exc}") from None
    if version > SCHEMA_VERSION:
        raise StartupError(
            f"the database at {describe_url(url)} has schema version {version} but this "
            f"bot knows only up to {SCHEMA_VERSION}: a newer version of the bot wrote it; "
            "run that version (never downgrade the database)"
        )


def _check_place(path: Path, what: str, setting: str) -> None:
    """`path` (a file that may not exist yet) can be written, and so can its directory,
    where SQLite keeps its -wal and -shm files next to it."""
    if path.exists() and not path.is_file():
        raise StartupError(f"{what} {path} is not a file; move it away or set {setting}")
    if path.exists():
        try:
            fd = os.open(path, os.O_RDWR)  # opening for writing changes neither bytes nor mtime
        except OSError as exc:
            raise StartupError(
                f"{what} {path} is read-only ({exc.strerror}); the bot writes to it: make it "
                f"writable for uid {os.geteuid()} or set {setting}"
            ) from None
        os.close(fd)
    directory = _nearest_existing(path.parent)
    try:
        with tempfile.TemporaryFile(dir=directory):
            pass
    except OSError as exc:
        if exc.errno not in (errno.EACCES, errno.EPERM, errno.EROFS):
            raise StartupError(f"{what}'s directory {directory} is unusable ({exc})") from None
        raise StartupError(
            f"{what}'s directory {directory} is not writable ({exc.strerror}); SQLite keeps "
            f"its journal next to {path.name}: make the directory writable for uid "
            f"{os.geteuid()} or set {setting}"
        ) from None


def _nearest_existing(directory: Path) -> Path:
    """The directory itself, or the ancestor it would be created in."""
    while not directory.exists() and directory != directory.parent:
        directory = directory.parent
    return directory
