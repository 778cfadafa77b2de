"""Typed settings, read once at start from the environment (and `.env`).

This is the one place every setting is checked, the engine's tunables included:
`sonality.config` reads the same variables for seed compatibility but only falls back
to defaults on bad values, so `python -m app` validates here first, refuses a bad value
in one line (`app/startup.py`) and then hands the engine what passed.
"""

from __future__ import annotations

import math
import re
from datetime import time
from pathlib import Path
from typing import Any, Literal, Self
from urllib.parse import urlsplit
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from pydantic import Field, SecretStr, ValidationInfo, field_validator, model_validator
from pydantic_core import PydanticCustomError
from pydantic_settings import BaseSettings, SettingsConfigDict

from providers import (
    DEFAULT_MODELS,
    HOSTED_TIMEOUT_SECONDS,
    LOCAL_TIMEOUT_SECONDS,
    Provider,
    is_local_endpoint,
)
from providers.pricing import ModelPrice
from providers.vision import known_to_take_images
from sonality import config as engine_config

#: The upper bounds of the settings that become a date span, a sleep, a count or a size.
#: Why every such setting has one: a "forever" value such as 999999 days or 1e10 minutes
#: passes a lower bound, then overflows `datetime` in the middle of retention or of
#: every reply (`now - timedelta(...)`), stopping that work silently instead of being
#: refused at start. Each bound is far above any sensible value and far below an
#: overflow. Days: 100 years, "forever" for a retention.
MAX_DAYS = 36_500
#: Minutes (a conversation's memory, idle times): a year.
MAX_MINUTES = 365 * 24 * 60
#: Seconds of a wait or window for which a day is already far too long.
DAY_SECONDS = 86_400
#: The most of anything counted (interactions, messages in a window): a million.
MAX_COUNT = 1_000_000
#: As `bot.commands.MAX_DAILY_LIMIT_USD`, the most a moderator may set per community.
MAX_DAILY_BUDGET_USD = 100_000

#: Far above any real bot's shard count; keeps a typo like "0-99999999" from
#: building a list of a hundred million shard ids.
MAX_SHARD_ID = 65_535


def _engine(name: str) -> Any:
    """The field of an engine tunable: its default and bounds are the engine's own, and
    below `MAX_COUNT` where the engine sets no upper one (a count of interactions)."""
    low, high = engine_config.LIMITS[name]
    return Field(
        default=engine_config.DEFAULTS[name],
        ge=low,
        le=None if math.isinf(high) else high,
        lt=MAX_COUNT if math.isinf(high) else None,
        alias=f"SONALITY_{name}",
    )


class Settings(BaseSettings):
    model_config = SettingsConfigDict(
        env_file=".env",
        env_file_encoding="utf-8",
        extra="ignore",
        populate_by_name=True,
        # `SONALITY_X=` in .env means "the default", as in .env.example's blank lines.
        env_ignore_empty=True,
        # inf passes ge/gt checks (an endless timeout) and nan fails them confusingly.
        allow_inf_nan=False,
    )

    # --- LLM -------------------------------------------------------------------
    llm_provider: Provider = Field(default="anthropic", alias="SONALITY_LLM_PROVIDER")
    anthropic_api_key: SecretStr | None = Field(default=None, alias="ANTHROPIC_API_KEY")
    anthropic_base_url: str | None = Field(default=None, alias="ANTHROPIC_BASE_URL")
    # Empty or unset works: Ollama and most local servers take no key.
    openai_api_key: SecretStr | None = Field(default=None, alias="OPENAI_API_KEY")
    openai_base_url: str | None = Field(default=None, alias="OPENAI_BASE_URL")
    # Unset: the provider's defaults (`providers.DEFAULT_MODELS`), filled in below.
    model: str = Field(default="", alias="SONALITY_MODEL")
    ess_model: str = Field(default="", alias="SONALITY_ESS_MODEL")
    # Per-model prices overriding the built-in table, as JSON:
    # {"llama3.1:8b": {"input": 0, "output": 0}}
    prices: dict[str, ModelPrice] = Field(default_factory=dict, alias="SONALITY_PRICES")
    # Default daily spending limit per community in USD; unset = no limit.
    daily_budget_usd: float | None = Field(
        default=None, ge=0, le=MAX_DAILY_BUDGET_USD, alias="SONALITY_DAILY_BUDGET_USD"
    )
    # The most one member may spend of a community's daily limit, as a share of it
    # (0.5: half); 1 turns the rule off. See bot/budget.py. More than 0: a share of 0
    # would refuse every member of a community with a limit, from its first message.
    member_budget_share: float = Field(
        default=0.5, gt=0, le=1, alias="SONALITY_MEMBER_BUDGET_SHARE"
    )
    max_concurrent_llm: int = Field(default=16, ge=1, le=1000, alias="SONALITY_MAX_CONCURRENT_LLM")
    llm_max_retries: int = Field(default=3, ge=0, le=20, alias="SONALITY_LLM_MAX_RETRIES")
    # Unset: 60 s, or 300 s for a server on this machine or network (`llm_timeout`).
    llm_timeout_seconds: float | None = Field(
        default=None, gt=0, le=3600, alias="SONALITY_LLM_TIMEOUT_SECONDS"
    )
    # --- local models (docs/models.md "Running a local model") ---------------------
    # The most output tokens a call of each role may ask for (usage_role: reply,
    # evidence = ESS and insight, reflection); unset = the engine's own limit.
    reply_max_tokens: int | None = Field(
        default=None, ge=16, le=100_000, alias="SONALITY_REPLY_MAX_TOKENS"
    )
    evidence_max_tokens: int | None = Field(
        default=None, ge=128, le=100_000, alias="SONALITY_EVIDENCE_MAX_TOKENS"
    )
    reflection_max_tokens: int | None = Field(
        default=None, ge=128, le=100_000, alias="SONALITY_REFLECTION_MAX_TOKENS"
    )
    # Extra request fields per model for the openai provider, as JSON; "*" is every
    # model not named. Unset: LOCAL_MODEL_OPTIONS on a local endpoint, nothing otherwise.
    model_options: dict[str, dict[str, Any]] | None = Field(
        default=None, alias="SONALITY_MODEL_OPTIONS"
    )

    # --- engine (handed to `sonality.config` at start) ---------------------------------
    ess_threshold: float = _engine("ESS_THRESHOLD")
    bootstrap_dampening_until: int = _engine("BOOTSTRAP_DAMPENING_UNTIL")
    opinion_cooling_period: int = _engine("OPINION_COOLING_PERIOD")
    semantic_retrieval_count: int = _engine("SEMANTIC_RETRIEVAL_COUNT")
    episodic_retrieval_count: int = _engine("EPISODIC_RETRIEVAL_COUNT")
    reflection_every: int = _engine("REFLECTION_EVERY")

    # --- storage ---------------------------------------------------------------
    data_dir: Path = Field(default=Path("data"), alias="SONALITY_DATA_DIR")
    database_path: Path | None = Field(default=None, alias="SONALITY_DATABASE_PATH")
    # Unset: the SQLite file above. ``postgresql://user:password@host:5432/db``: the
    # state lives in that PostgreSQL database instead (a secret: it may hold a password).
    database_url: SecretStr | None = Field(default=None, alias="DATABASE_URL")
    chroma_dir: Path | None = Field(default=None, alias="SONALITY_CHROMA_DIR")
    model_cache_dir: Path | None = Field(default=None, alias="SONALITY_MODEL_CACHE_DIR")
    # The embedding model's int8 copy (about half the CPU per text, 50 MB less memory,
    # vectors within cosine 0.98 of the float model's); false: the float model.
    embedding_int8: bool = Field(default=True, alias="SONALITY_EMBEDDING_INT8")
    # Memory indexes (a community's episodes, its insights) Chroma may hold before it is
    # reopened to free them: a memory bound. Each open index holds about 3 MB whatever
    # its size (2.6 MB of it fixed inside hnswlib). 32 keeps bench figure 4 (100
    # communities active) near 300 MB; 100 would spare each message reopening its index
    # there (figure 3a: 12 ms of CPU instead of 17-18) but takes the process past 500 MB.
    # Set it above the communities chatting at once if the memory is there.
    chroma_max_open: int = Field(default=32, ge=1, le=10_000, alias="SONALITY_CHROMA_MAX_OPEN")
    # A Chroma server (`chroma run`) for episodes instead of the local directory, so
    # several bot processes can share them: http://host:port (https:// for TLS).
    chroma_url: str | None = Field(default=None, alias="CHROMA_URL")
    # The server's database for this bot's collections (created if missing), so bots
    # or test runs sharing one server keep apart.
    chroma_database: str = Field(
        default="default_database", min_length=3, max_length=63, alias="SONALITY_CHROMA_DATABASE"
    )
    chroma_timeout_seconds: float = Field(
        default=10.0, gt=0, le=600, alias="SONALITY_CHROMA_TIMEOUT_SECONDS"
    )
    # The longest a learned episode waits in memory before its batch is written to
    # Chroma (sooner once 8 wait); until then recall ranks it in memory.
    episode_flush_seconds: float = Field(
        default=10.0, ge=0, le=3600, alias="SONALITY_EPISODE_FLUSH_SECONDS"
    )
    # Retention, applied hourly by the housekeeping job (storage/retention.py). Days the
    # text of answered messages (the member's words and the reply) is kept; nothing
    # reads it once the message is learned, moderators looking into a report get a
    # season. Every span in days is at most MAX_DAYS (100 years: "forever").
    message_retention_days: int = Field(
        default=90, ge=1, le=MAX_DAYS, alias="SONALITY_MESSAGE_RETENTION_DAYS"
    )
    # Days the audit trail (ESS ratings, reflections, rollbacks), moderator actions and
    # daily token usage are kept: a year of "who changed what, and what did it cost".
    audit_retention_days: int = Field(
        default=365, ge=1, le=MAX_DAYS, alias="SONALITY_AUDIT_RETENTION_DAYS"
    )
    # Days a community's data is kept after the bot is removed from it (Discord guild
    # left/kicked, Slack app uninstalled or its tokens revoked); 0 = erased at once. Long
    # enough to survive an accidental kick, short enough not to keep a community that left.
    delete_after_removal_days: int = Field(
        default=30, ge=0, le=MAX_DAYS, alias="SONALITY_DELETE_AFTER_REMOVAL_DAYS"
    )
    # Fernet key that encrypts stored Slack installation tokens (multi-workspace mode).
    secret_key: SecretStr | None = Field(default=None, alias="SONALITY_SECRET_KEY")

    # --- conversation ------------------------------------------------------------
    max_message_chars: int = Field(
        default=4000, ge=100, le=100_000, alias="SONALITY_MAX_MESSAGE_CHARS"
    )
    buffer_turns: int = Field(default=12, ge=0, le=1000, alias="SONALITY_BUFFER_TURNS")
    buffer_chars: int = Field(default=12000, ge=0, le=500_000, alias="SONALITY_BUFFER_CHARS")
    # Minutes become `now - timedelta(...)` in every reply: at most MAX_MINUTES (a year).
    buffer_ttl_minutes: float = Field(
        default=120.0, gt=0, le=MAX_MINUTES, alias="SONALITY_BUFFER_TTL_MINUTES"
    )
    rate_limit_messages: int = Field(
        default=6, ge=1, le=MAX_COUNT, alias="SONALITY_RATE_LIMIT_MESSAGES"
    )
    rate_limit_window_seconds: float = Field(
        default=60.0, gt=0, le=DAY_SECONDS, alias="SONALITY_RATE_LIMIT_WINDOW_SECONDS"
    )
    # Whether members' images go to the reply model: "auto" when SONALITY_MODEL is one
    # the bot knows to read images (providers/vision.py), "on" always (a local vision
    # model), "off" never. Without it a member's image gets a note that it was not read.
    vision: Literal["auto", "on", "off"] = Field(default="auto", alias="SONALITY_VISION")
    agent_idle_evict_minutes: float = Field(
        default=30.0, gt=0, le=MAX_MINUTES, alias="SONALITY_AGENT_IDLE_EVICT_MINUTES"
    )
    # Where the bot speaks in a channel no moderator set with `/sonality channel`:
    # `mention` (@mentions and replies to it), `free` (every member's message, paced by
    # SONALITY_FREE_CHANNEL_SECONDS) or `off` (nothing; commands still work).
    channel_mode: Literal["mention", "free", "off"] = Field(
        default="mention", alias="SONALITY_CHANNEL_MODE"
    )
    # In a `free` channel, at most one reply per this many seconds to messages that did
    # not mention the bot (0: no pause); mentions are always answered.
    free_channel_seconds: float = Field(
        default=20.0, ge=0, le=DAY_SECONDS, alias="SONALITY_FREE_CHANNEL_SECONDS"
    )
    # Other bots the bot may answer (bot/bot_exchanges.py): their ids, comma-separated
    # (a Discord bot's user id; a Slack bot's B…, U… or A… id). Empty: every bot ignored.
    answer_bots: str = Field(default="", alias="SONALITY_ANSWER_BOTS")
    # Replies to those bots in a row per channel, until a person writes there.
    bot_exchanges: int = Field(default=3, ge=1, le=100, alias="SONALITY_BOT_EXCHANGES")

    # --- scheduler -------------------------------------------------------------------
    nightly_hour: int = Field(default=4, ge=0, le=23, alias="SONALITY_NIGHTLY_HOUR")
    # The nightly run to the minute (HH:MM) or second (HH:MM:SS), in SONALITY_TIMEZONE;
    # set it instead of SONALITY_NIGHTLY_HOUR (`nightly_at` is what the scheduler uses).
    nightly_time: time | None = Field(default=None, alias="SONALITY_NIGHTLY_TIME")
    timezone: str = Field(default="UTC", alias="SONALITY_TIMEZONE")
    nightly_jitter_seconds: int = Field(
        default=900, ge=0, le=DAY_SECONDS, alias="SONALITY_NIGHTLY_JITTER_SECONDS"
    )
    idle_reflect_minutes: float = Field(
        default=30.0, gt=0, le=MAX_MINUTES, alias="SONALITY_IDLE_REFLECT_MINUTES"
    )
    idle_check_seconds: float = Field(
        default=60.0, gt=0, le=DAY_SECONDS, alias="SONALITY_IDLE_CHECK_SECONDS"
    )

    # --- terminal ------------------------------------------------------------------
    terminal_user: str = Field(
        default="you", min_length=1, max_length=64, alias="SONALITY_TERMINAL_USER"
    )

    # --- Discord -----------------------------------------------------------------------
    discord_token: SecretStr | None = Field(default=None, alias="DISCORD_TOKEN")
    discord_api_base_url: str = Field(
        default="https://discord.com/api/v10", alias="DISCORD_API_BASE_URL"
    )
    discord_gateway_url: str = Field(
        default="wss://gateway.discord.gg/", alias="DISCORD_GATEWAY_URL"
    )
    discord_dev_guild_id: int | None = Field(default=None, alias="DISCORD_DEV_GUILD_ID")
    discord_shard_count: int | None = Field(
        default=None, ge=1, le=MAX_SHARD_ID + 1, alias="DISCORD_SHARD_COUNT"
    )
    # The shards this process runs, of DISCORD_SHARD_COUNT in all: "0,1", "0-3" or
    # "0-3,8". Unset: all of them. Every guild's events go to one shard, so to one process.
    discord_shard_ids: str | None = Field(default=None, alias="DISCORD_SHARD_IDS")
    discord_allow_dms: bool = Field(default=False, alias="DISCORD_ALLOW_DMS")
    # Off: the bot answers @mentions, replies that ping it, and DMs, which Discord sends
    # with their text anyway; no privileged intent to enable or have reviewed.
    discord_message_content: bool = Field(default=False, alias="DISCORD_MESSAGE_CONTENT_INTENT")

    # --- Slack -------------------------------------------------------------------------
    slack_bot_token: SecretStr | None = Field(default=None, alias="SLACK_BOT_TOKEN")
    slack_app_token: SecretStr | None = Field(default=None, alias="SLACK_APP_TOKEN")
    slack_signing_secret: SecretStr | None = Field(default=None, alias="SLACK_SIGNING_SECRET")
    slack_client_id: str | None = Field(default=None, alias="SLACK_CLIENT_ID")
    slack_client_secret: SecretStr | None = Field(default=None, alias="SLACK_CLIENT_SECRET")
    slack_api_url: str = Field(default="https://slack.com/api/", alias="SLACK_API_URL")
    slack_port: int = Field(default=3000, ge=1, le=65535, alias="SLACK_PORT")
    slack_moderator_ids: str = Field(default="", alias="SLACK_MODERATOR_IDS")
    slack_allow_dms: bool = Field(default=False, alias="SLACK_ALLOW_DMS")

    # --- direct messages (DISCORD_ALLOW_DMS, SLACK_ALLOW_DMS) ---------------------------
    # Whether the person in a DM with the bot may run the moderator commands there
    # (budget <usd>, rollback, reflect, forget-user) on their own DM personality. Off:
    # a DM has no moderator, and its spending limit is SONALITY_DAILY_BUDGET_USD.
    dm_moderation: bool = Field(default=False, alias="SONALITY_DM_MODERATION")

    # --- health check (app/health.py) ---------------------------------------------------
    # Unset: no endpoint. Loopback by default; a container sets 0.0.0.0 to publish it.
    health_port: int | None = Field(default=None, ge=1, le=65535, alias="SONALITY_HEALTH_PORT")
    health_host: str = Field(default="127.0.0.1", min_length=1, alias="SONALITY_HEALTH_HOST")
    health_llm_failing_seconds: float = Field(
        default=300.0, gt=0, le=7 * DAY_SECONDS, alias="SONALITY_HEALTH_LLM_FAILING_SECONDS"
    )

    # --- logging (app/logs.py): stdout by default, a rotated file only when named -------
    log_level: str = Field(default="INFO", alias="SONALITY_LOG_LEVEL")
    log_file: Path | None = Field(default=None, alias="SONALITY_LOG_FILE")
    log_file_max_bytes: int = Field(
        default=10 * 1024 * 1024, ge=1000, le=1_000_000_000, alias="SONALITY_LOG_FILE_MAX_BYTES"
    )
    log_file_backups: int = Field(default=5, ge=1, le=1000, alias="SONALITY_LOG_FILE_BACKUPS")
    log_format: Literal["text", "json"] = Field(default="text", alias="SONALITY_LOG_FORMAT")

    # --- the settings themselves (app/setting_names.py) ----------------------------------
    # A SONALITY_/DISCORD_/SLACK_ name the bot does not read is a warning at start;
    # true: a refusal (exit 2), for deployments where a typo must never pass.
    strict_settings: bool = Field(default=False, alias="SONALITY_STRICT_SETTINGS")

    @field_validator("timezone")
    @classmethod
    def _known_timezone(cls, value: str) -> str:
        try:
            ZoneInfo(value)
        except (ZoneInfoNotFoundError, ValueError):
            raise ValueError("must be an IANA time zone such as UTC or Europe/Berlin") from None
        return value

    @field_validator("nightly_time", mode="before")
    @classmethod
    def _time_of_day(cls, value: object) -> object:
        # Only the two spellings an admin writes: pydantic's own time parsing would also
        # take seconds since midnight, fractions and UTC offsets, which the time zone
        # setting already covers and a typo could hit by accident.
        if value is None or isinstance(value, time):
            return value
        found = re.fullmatch(r"(\d{1,2}):(\d{2})(?::(\d{2}))?", str(value).strip())
        if found is not None:
            hour, minute, second = (int(part or 0) for part in found.groups())
            if hour <= 23 and minute <= 59 and second <= 59:
                return time(hour, minute, second)
        raise ValueError("must be a time of day as HH:MM or HH:MM:SS, such as 04:30")

    @model_validator(mode="after")
    def _one_nightly_time(self) -> Self:
        if self.nightly_time is not None and "nightly_hour" in self.model_fields_set:
            raise PydanticCustomError(
                "nightly_time_twice",
                "SONALITY_NIGHTLY_TIME and SONALITY_NIGHTLY_HOUR are both set; keep one "
                "(SONALITY_NIGHTLY_TIME=04:30 says hour and minute)",
            )
        return self

    @property
    def nightly_at(self) -> time:
        """When the nightly reflection runs, in `timezone` (before jitter)."""
        return self.nightly_time or time(self.nightly_hour)

    @field_validator("anthropic_base_url", "openai_base_url")
    @classmethod
    def _no_credentials_in_url(cls, value: str | None) -> str | None:
        """The model clients send their key in a header, and the HTTP library refuses a
        URL with a `user:password@` beside it (the OpenAI client at start, with a
        traceback; Anthropic's on every call): refused here in one line instead."""
        if value is not None and "@" in urlsplit(value.strip()).netloc:
            raise ValueError(
                "must not hold a user name or password (user:password@host): the key goes "
                "in ANTHROPIC_API_KEY or OPENAI_API_KEY"
            )
        return value

    @field_validator("chroma_url")
    @classmethod
    def _chroma_server_url(cls, value: str | None) -> str | None:
        if value is None:
            return None
        parts = urlsplit(value.strip())
        try:
            parts.port  # noqa: B018  # raises on a port that is not a number in range
        except ValueError:
            raise ValueError("has a bad port; use http://host:port") from None
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError("must be a Chroma server's address such as http://127.0.0.1:8000")
        if parts.path.strip("/") or parts.query or parts.fragment:
            raise ValueError("must be only scheme, host and port, such as http://chroma:8000")
        return value.strip()

    @field_validator("discord_token")
    @classmethod
    def _one_token(cls, value: SecretStr | None) -> SecretStr | None:
        # A token with a space or line break inside (a pasted "Bot " prefix, a quote
        # split over two lines) would otherwise end in aiohttp's header-injection error.
        if value is None:
            return None
        token = value.get_secret_value().strip()
        if not token or any(c.isspace() or not c.isprintable() for c in token):
            raise ValueError(
                "must be the bot token alone, without spaces or line breaks "
                "(copy it from Bot → Reset Token in the Discord Developer Portal)"
            )
        return SecretStr(token)

    @field_validator("discord_shard_ids")
    @classmethod
    def _shard_range(cls, value: str | None, info: ValidationInfo) -> str | None:
        if value is None:
            return None
        if "discord_shard_count" not in info.data:
            return value  # DISCORD_SHARD_COUNT is itself wrong: its own error says so
        ids = parse_shard_ids(value)
        count = info.data["discord_shard_count"]
        if count is None:
            raise ValueError("needs DISCORD_SHARD_COUNT, the number of shards of all processes")
        outside = [i for i in ids if i >= count]
        if outside:
            raise ValueError(
                f"shard {outside[0]} does not exist with DISCORD_SHARD_COUNT={count} "
                f"(shards are 0 to {count - 1})"
            )
        return ",".join(str(i) for i in ids)

    @property
    def discord_shards(self) -> list[int] | None:
        """The shard ids this process runs (None: every shard, or no sharding)."""
        if self.discord_shard_ids is None:
            return None
        return parse_shard_ids(self.discord_shard_ids)

    @field_validator("answer_bots")
    @classmethod
    def _bot_ids(cls, value: str) -> str:
        ids = [part.strip() for part in value.split(",") if part.strip()]
        for bot_id in ids:
            if not bot_id.isascii() or not bot_id.isalnum():
                raise ValueError(
                    f"{bot_id[:40]!r} is not a bot id: list ids separated by commas, such as "
                    "a Discord bot's user id (digits) or a Slack bot's B…/U… id"
                )
        return ",".join(ids)

    @property
    def answer_bot_ids(self) -> frozenset[str]:
        """The ids in SONALITY_ANSWER_BOTS (empty: no bot is ever answered)."""
        return frozenset(self.answer_bots.split(",")) - {""}

    @field_validator("database_url")
    @classmethod
    def _postgres_url(cls, value: SecretStr | None) -> SecretStr | None:
        if value is None or not value.get_secret_value().strip():
            return None
        from storage.postgres import is_postgres_url

        if not is_postgres_url(value.get_secret_value().strip()):
            raise ValueError(
                "must be a postgresql:// URL (postgresql://user:password@host:5432/name); "
                "leave it unset to keep the SQLite file"
            )
        return SecretStr(value.get_secret_value().strip())

    @property
    def postgres_url(self) -> str | None:
        """The PostgreSQL URL when DATABASE_URL is set, else None (SQLite)."""
        return None if self.database_url is None else self.database_url.get_secret_value()

    @field_validator("secret_key")
    @classmethod
    def _fernet_key(cls, value: SecretStr | None) -> SecretStr | None:
        if value is None:
            return None
        from storage.models import StorageError
        from storage.platform import KEY_HOWTO, make_cipher

        try:
            make_cipher(value.get_secret_value())
        except StorageError:
            raise ValueError(
                f"must be a Fernet key (32 url-safe base64 bytes); {KEY_HOWTO}"
            ) from None
        return value

    @property
    def slack_oauth(self) -> bool:
        """Installable in many workspaces: tokens come from OAuth and are stored."""
        return self.slack_client_id is not None

    @field_validator("log_level")
    @classmethod
    def _known_log_level(cls, value: str) -> str:
        if value.strip().upper() not in engine_config.LOG_LEVELS:
            raise ValueError(f"must be one of {', '.join(engine_config.LOG_LEVELS)}")
        return value.strip().upper()

    @field_validator("model_options")
    @classmethod
    def _own_fields_only(
        cls, value: dict[str, dict[str, Any]] | None
    ) -> dict[str, dict[str, Any]] | None:
        for model, fields in (value or {}).items():
            taken = sorted(set(fields) & RESERVED_REQUEST_FIELDS)
            if taken:
                raise ValueError(
                    f"{model}: {taken[0]} is set by the bot itself; use sampling fields "
                    'such as {"frequency_penalty": 0.3} or {"repeat_penalty": 1.1}'
                )
        return value

    @model_validator(mode="after")
    def _options_need_openai(self) -> Self:
        if self.model_options and self.llm_provider != "openai":
            raise PydanticCustomError(
                "model_options_provider",
                "SONALITY_MODEL_OPTIONS works with SONALITY_LLM_PROVIDER=openai only "
                "(Anthropic's API refuses fields it does not know)",
            )
        return self

    @property
    def llm_base_url(self) -> str | None:
        """The configured endpoint of the chosen provider (None: the vendor's own)."""
        return self.openai_base_url if self.llm_provider == "openai" else self.anthropic_base_url

    @property
    def llm_timeout(self) -> float:
        """SONALITY_LLM_TIMEOUT_SECONDS, else longer for a server on this machine or network."""
        if self.llm_timeout_seconds is not None:
            return self.llm_timeout_seconds
        return (
            LOCAL_TIMEOUT_SECONDS
            if is_local_endpoint(self.llm_base_url)
            else HOSTED_TIMEOUT_SECONDS
        )

    @property
    def resolved_model_options(self) -> dict[str, dict[str, Any]]:
        """What `OpenAILLM` adds to each request, by model (see SONALITY_MODEL_OPTIONS)."""
        if self.model_options is not None:
            return self.model_options
        if self.llm_provider == "openai" and is_local_endpoint(self.llm_base_url):
            return {"*": dict(LOCAL_MODEL_OPTIONS)}
        return {}

    @property
    def output_caps(self) -> dict[str, int | None]:
        """The per-role output caps, keyed by `storage.models.UsageRole`."""
        return {
            "reply": self.reply_max_tokens,
            "evidence": self.evidence_max_tokens,
            "reflection": self.reflection_max_tokens,
        }

    @model_validator(mode="after")
    def _provider_defaults(self) -> Self:
        reply, evidence = DEFAULT_MODELS[self.llm_provider]
        self.model = self.model.strip() or reply
        self.ess_model = self.ess_model.strip() or evidence
        return self

    @property
    def reads_images(self) -> bool:
        """Whether members' images go to the reply model (SONALITY_VISION)."""
        if self.vision == "auto":
            return known_to_take_images(self.model)
        return self.vision == "on"

    @property
    def resolved_database_path(self) -> Path:
        return self.database_path or self.data_dir / "sonality.sqlite3"

    @property
    def resolved_chroma_dir(self) -> Path:
        return self.chroma_dir or self.data_dir / "chromadb"

    @property
    def resolved_model_cache_dir(self) -> Path:
        return self.model_cache_dir or self.data_dir / "models"

    @property
    def discord_enabled(self) -> bool:
        return self.discord_token is not None

    @property
    def slack_enabled(self) -> bool:
        return self.slack_bot_token is not None or self.slack_client_id is not None

    @property
    def slack_moderators(self) -> frozenset[str]:
        return frozenset(x.strip() for x in self.slack_moderator_ids.split(",") if x.strip())


#: Request fields the bot sets itself, which SONALITY_MODEL_OPTIONS may not override.
RESERVED_REQUEST_FIELDS = frozenset(
    {
        "model",
        "messages",
        "max_tokens",
        "max_completion_tokens",
        "tools",
        "tool_choice",
        "response_format",
        "stream",
        "stream_options",
    }
)

#: Sent to every model of a local endpoint unless SONALITY_MODEL_OPTIONS says otherwise:
#: small local models fall into repetition loops (a 135M model once repeated one
#: sentence for 7,781 characters), and `frequency_penalty` is the repetition control
#: that llama.cpp, Ollama, vLLM and LM Studio all accept under OpenAI's own name.
LOCAL_MODEL_OPTIONS: dict[str, float] = {"frequency_penalty": 0.5}


def parse_shard_ids(text: str) -> list[int]:
    """ "0,2" or "0-3" or "0-3,8" -> sorted ids; ValueError in words for anything else."""
    ids: set[int] = set()
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        low, dash, high = part.partition("-")
        if not low.strip().isdigit() or (dash and not high.strip().isdigit()):
            raise ValueError('must be shard numbers and ranges such as "0,1" or "0-3"')
        first, last = int(low), int(high) if dash else int(low)
        if last > MAX_SHARD_ID:
            raise ValueError(f"shard {last} is beyond any shard count ({MAX_SHARD_ID} at most)")
        if last < first:
            raise ValueError(f"the range {part} runs backwards; write {last}-{first}")
        ids.update(range(first, last + 1))
    if not ids:
        raise ValueError('names no shard; write e.g. "0,1" or "0-3"')
    return sorted(ids)
