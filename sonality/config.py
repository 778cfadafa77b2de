"""Engine constants, read from the environment once at import (seed names).

Reading never fails: an unusable value falls back to the seed default, so a typo in
`.env` cannot break every import. Reporting bad values is the host's job; it then
installs its validated values with `configure()`. The engine reads `config.NAME` at
call time.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import TypeVar

from dotenv import find_dotenv, load_dotenv

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


def configure(
    *,
    model: str | None = None,
    ess_model: str | None = None,
    log_level: str | None = None,
    ess_threshold: float | None = None,
    bootstrap_dampening_until: int | None = None,
    opinion_cooling_period: int | None = None,
    semantic_retrieval_count: int | None = None,
    episodic_retrieval_count: int | None = None,
    reflection_every: int | None = None,
) -> None:
    """Install values the host validated (None keeps the current one); anything the
    engine cannot work with raises ValueError before anything changes."""
    numbers: dict[str, float | None] = {
        "ESS_THRESHOLD": ess_threshold,
        "BOOTSTRAP_DAMPENING_UNTIL": bootstrap_dampening_until,
        "OPINION_COOLING_PERIOD": opinion_cooling_period,
        "SEMANTIC_RETRIEVAL_COUNT": semantic_retrieval_count,
        "EPISODIC_RETRIEVAL_COUNT": episodic_retrieval_count,
        "REFLECTION_EVERY": reflection_every,
    }
    for name, value in numbers.items():
        low, high = LIMITS[name]
        if value is not None and not (math.isfinite(value) and low <= value <= high):
            raise ValueError(f"{name} must be between {low} and {high}, not {value}")
    if log_level is not None and log_level.upper() not in LOG_LEVELS:
        raise ValueError(f"LOG_LEVEL must be one of {', '.join(LOG_LEVELS)}, not {log_level}")
    # A blank model keeps the current one; a blank log level was refused above.
    texts = {"MODEL": model, "ESS_MODEL": ess_model, "LOG_LEVEL": (log_level or "").upper()}
    globals().update({n: v for n, v in numbers.items() if v is not None})
    globals().update({n: v for n, v in texts.items() if v})
    global EPISODE_RETRIEVAL_COUNT
    EPISODE_RETRIEVAL_COUNT = SEMANTIC_RETRIEVAL_COUNT + EPISODIC_RETRIEVAL_COUNT
