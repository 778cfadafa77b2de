"""Engine constants, read from the environment once at import (seed names), and
`EngineConfig`, the frozen set of tunables a host hands to each agent.

Reading never fails: an unusable value falls back to the seed default, so a typo in
`.env` cannot break every import. Reporting bad values is the host's job; it then
builds an `EngineConfig` from its validated values and passes it in. Nothing rewrites
these constants at run time: the engine reads tunables from the `EngineConfig` it was
given, and only code that passes none gets `ENVIRONMENT`, the one built from them.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any, TypeVar

from dotenv import find_dotenv, load_dotenv
from pydantic import BaseModel, ConfigDict, ValidationInfo, field_validator

# The working directory's .env, like the bot's settings (not one found next to this file).
load_dotenv(find_dotenv(usecwd=True))

LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
N = TypeVar("N", int, float)


def _env_str(name: str, default: str) -> str:
    """Blank counts as unset, so a `.env` line like `SONALITY_MODEL=` keeps the default."""
    return os.environ.get(name, "").strip() or default


def _env_number(name: str, kind: type[N]) -> N:
    default = kind(DEFAULTS[name.removeprefix("SONALITY_")])
    low, high = LIMITS[name.removeprefix("SONALITY_")]
    try:
        value = kind(_env_str(name, str(default)))
    except ValueError:
        return default
    # An int is finite (and may be too large for `math.isfinite`).
    finite = isinstance(value, int) or math.isfinite(value)
    return value if finite and low <= value <= high else default


def _env_log_level(name: str, default: str) -> str:
    value = _env_str(name, default).upper()
    return value if value in LOG_LEVELS else default


# --- paths (the seed's single-user layout; the bot keeps versions in its database) -----
PROJECT_ROOT = Path(__file__).resolve().parent.parent
# The bot's rule (SONALITY_DATA_DIR, default ./data), so both agree where data lives.
DATA_DIR = Path(_env_str("SONALITY_DATA_DIR", "data"))
SPONGE_FILE = DATA_DIR / "sponge.json"
SPONGE_HISTORY_DIR = DATA_DIR / "sponge_history"
CHROMADB_DIR = DATA_DIR / "chromadb"
# Where the embedding model built from the bundled weights is kept (the bot's
# SONALITY_MODEL_CACHE_DIR rule, so both share one copy).
MODEL_CACHE_DIR = Path(_env_str("SONALITY_MODEL_CACHE_DIR", str(DATA_DIR / "models")))

# --- models ---------------------------------------------------------------------------
ANTHROPIC_API_KEY = os.environ.get("ANTHROPIC_API_KEY", "")
DEFAULT_MODEL = "claude-sonnet-4-6"
MODEL = _env_str("SONALITY_MODEL", DEFAULT_MODEL)
DEFAULT_ESS_MODEL = "claude-haiku-4-5"
ESS_MODEL = _env_str("SONALITY_ESS_MODEL", DEFAULT_ESS_MODEL)

# --- parameters -----------------------------------------------------------------------
# More memories than this per prompt would crowd out the conversation itself.
MAX_RETRIEVAL_COUNT = 50
#: The tunables a host may set (read from SONALITY_<NAME>): default, then the bounds the
#: engine works within. The bot's settings take both from here.
DEFAULTS: dict[str, float] = {
    "ESS_THRESHOLD": 0.3,
    "BOOTSTRAP_DAMPENING_UNTIL": 10,
    "OPINION_COOLING_PERIOD": 3,
    "SEMANTIC_RETRIEVAL_COUNT": 2,
    "EPISODIC_RETRIEVAL_COUNT": 3,
    "REFLECTION_EVERY": 20,
}
LIMITS: dict[str, tuple[float, float]] = {
    "ESS_THRESHOLD": (0.0, 1.0),
    "BOOTSTRAP_DAMPENING_UNTIL": (0, math.inf),
    "OPINION_COOLING_PERIOD": (0, math.inf),
    "SEMANTIC_RETRIEVAL_COUNT": (0, MAX_RETRIEVAL_COUNT),
    "EPISODIC_RETRIEVAL_COUNT": (0, MAX_RETRIEVAL_COUNT),
    "REFLECTION_EVERY": (1, math.inf),
}
LOG_LEVEL = _env_log_level("SONALITY_LOG_LEVEL", "INFO")
ESS_THRESHOLD = _env_number("SONALITY_ESS_THRESHOLD", float)
SPONGE_MAX_TOKENS = 500
OPINION_BASE_RATE = 0.1
BELIEF_DECAY_RATE = 0.15
BOOTSTRAP_DAMPENING_UNTIL = _env_number("SONALITY_BOOTSTRAP_DAMPENING_UNTIL", int)
OPINION_COOLING_PERIOD = _env_number("SONALITY_OPINION_COOLING_PERIOD", int)
SEMANTIC_RETRIEVAL_COUNT = _env_number("SONALITY_SEMANTIC_RETRIEVAL_COUNT", int)
EPISODIC_RETRIEVAL_COUNT = _env_number("SONALITY_EPISODIC_RETRIEVAL_COUNT", int)
EPISODE_RETRIEVAL_COUNT = SEMANTIC_RETRIEVAL_COUNT + EPISODIC_RETRIEVAL_COUNT
MAX_CONVERSATION_CHARS = 100_000
REFLECTION_EVERY = _env_number("SONALITY_REFLECTION_EVERY", int)
REFLECTION_SHIFT_THRESHOLD = 0.1

# --- engine internals named by the seed -------------------------------------------------
MAX_ESS_RETRIES = 2
MAX_RECENT_SHIFTS = 10
RESPONSE_MAX_TOKENS = 2048
MIN_EPISODE_RELEVANCE = 0.3


#: The `EngineConfig` fields checked against `LIMITS` (each the lower-case name).
TUNABLES = tuple(name.lower() for name in DEFAULTS)


class EngineConfig(BaseModel):
    """The tunables of one agent, fixed for its life.

    Why an object passed in rather than module globals: two agents in one process (a
    test, an evaluation beside the bot) can each follow their own values, and nothing
    can change a running agent's rules behind its back. The defaults are the seed's;
    `from_environment()` gives the values this process read from SONALITY_*. A value
    outside `LIMITS` is refused here (pydantic's ValidationError, a ValueError), so an
    agent never starts with numbers the engine cannot work with. Strict types: a
    setting's text or a bool is not silently taken for a number.
    """

    model_config = ConfigDict(frozen=True, strict=True, extra="forbid", allow_inf_nan=False)

    model: str = DEFAULT_MODEL
    ess_model: str = DEFAULT_ESS_MODEL
    ess_threshold: float = DEFAULTS["ESS_THRESHOLD"]
    bootstrap_dampening_until: int = int(DEFAULTS["BOOTSTRAP_DAMPENING_UNTIL"])
    opinion_cooling_period: int = int(DEFAULTS["OPINION_COOLING_PERIOD"])
    semantic_retrieval_count: int = int(DEFAULTS["SEMANTIC_RETRIEVAL_COUNT"])
    episodic_retrieval_count: int = int(DEFAULTS["EPISODIC_RETRIEVAL_COUNT"])
    reflection_every: int = int(DEFAULTS["REFLECTION_EVERY"])

    @field_validator("model", "ess_model", mode="before")
    @classmethod
    def _blank_is_default(cls, value: Any, info: ValidationInfo) -> Any:
        """A blank model (an empty `SONALITY_MODEL=` line) means the default, as
        reading the environment treats it."""
        if isinstance(value, str):
            return value.strip() or cls.model_fields[str(info.field_name)].default
        return value

    @field_validator(*TUNABLES, mode="after")
    @classmethod
    def _within_limits(cls, value: float, info: ValidationInfo) -> float:
        name = str(info.field_name).upper()
        low, high = LIMITS[name]
        if not low <= value <= high:
            raise ValueError(f"{name} must be between {low} and {high}, not {value}")
        return value

    def model_copy(self, *, update: Any = None, deep: bool = False) -> EngineConfig:
        """A copy with `update` applied, validated like a new config: pydantic's own
        `model_copy` takes the values as given, so a threshold of 2 would slip in."""
        if not update:
            return super().model_copy(deep=deep)
        return type(self)(**{**self.model_dump(), **dict(update)})

    @property
    def episode_retrieval_count(self) -> int:
        """Memories per reply, both kinds together (the seed's EPISODE_RETRIEVAL_COUNT)."""
        return self.semantic_retrieval_count + self.episodic_retrieval_count

    @classmethod
    def from_environment(cls) -> EngineConfig:
        """The values this process read at import (SONALITY_* and `.env`; the seed
        default wherever a value was missing or unusable)."""
        return cls(
            model=MODEL,
            ess_model=ESS_MODEL,
            ess_threshold=ESS_THRESHOLD,
            bootstrap_dampening_until=BOOTSTRAP_DAMPENING_UNTIL,
            opinion_cooling_period=OPINION_COOLING_PERIOD,
            semantic_retrieval_count=SEMANTIC_RETRIEVAL_COUNT,
            episodic_retrieval_count=EPISODIC_RETRIEVAL_COUNT,
            reflection_every=REFLECTION_EVERY,
        )


#: What the engine follows when the caller passes no config (seed-API calls).
ENVIRONMENT = EngineConfig.from_environment()


def or_environment(config: EngineConfig | None) -> EngineConfig:
    """`config`, or `ENVIRONMENT` when the caller gave none (looked up at the call, so
    a test can stand in a fresh environment's values)."""
    return ENVIRONMENT if config is None else config
