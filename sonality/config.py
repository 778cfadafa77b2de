"""Engine constants, each overridable from the environment as the seed API specifies.

Values are read once at import (after loading `.env`), so a process has one consistent
configuration; tests that need other values pass them explicitly where functions
accept them.
"""

from __future__ import annotations

import os
from pathlib import Path

from dotenv import find_dotenv, load_dotenv

# The working directory's .env, like the bot's settings (not one found next to this file).
load_dotenv(find_dotenv(usecwd=True))


def _env_str(name: str, default: str) -> str:
    """Blank counts as unset, so a `.env` line like `SONALITY_MODEL=` keeps the default."""
    return os.environ.get(name, "").strip() or default


def _env_float(name: str, default: float) -> float:
    return float(_env_str(name, str(default)))


def _env_int(name: str, default: int) -> int:
    return int(_env_str(name, str(default)))


# --- paths (the seed's single-user file layout; the bot keeps versions in SQLite) -------
PROJECT_ROOT = Path(__file__).resolve().parent.parent
DATA_DIR = PROJECT_ROOT / "data"
SPONGE_FILE = DATA_DIR / "sponge.json"
SPONGE_HISTORY_DIR = DATA_DIR / "sponge_history"
CHROMADB_DIR = DATA_DIR / "chromadb"

# --- models ---------------------------------------------------------------------------
ANTHROPIC_API_KEY = os.environ.get("ANTHROPIC_API_KEY", "")
DEFAULT_MODEL = "claude-sonnet-4-6"
MODEL = _env_str("SONALITY_MODEL", DEFAULT_MODEL)
DEFAULT_ESS_MODEL = "claude-haiku-4-5"
ESS_MODEL = _env_str("SONALITY_ESS_MODEL", DEFAULT_ESS_MODEL)

# --- parameters -----------------------------------------------------------------------
LOG_LEVEL = _env_str("SONALITY_LOG_LEVEL", "INFO")
ESS_THRESHOLD = _env_float("SONALITY_ESS_THRESHOLD", 0.3)
SPONGE_MAX_TOKENS = 500
OPINION_BASE_RATE = 0.1
BELIEF_DECAY_RATE = 0.15
BOOTSTRAP_DAMPENING_UNTIL = _env_int("SONALITY_BOOTSTRAP_DAMPENING_UNTIL", 10)
OPINION_COOLING_PERIOD = _env_int("SONALITY_OPINION_COOLING_PERIOD", 3)
SEMANTIC_RETRIEVAL_COUNT = _env_int("SONALITY_SEMANTIC_RETRIEVAL_COUNT", 2)
EPISODIC_RETRIEVAL_COUNT = _env_int("SONALITY_EPISODIC_RETRIEVAL_COUNT", 3)
EPISODE_RETRIEVAL_COUNT = SEMANTIC_RETRIEVAL_COUNT + EPISODIC_RETRIEVAL_COUNT
MAX_CONVERSATION_CHARS = 100_000
REFLECTION_EVERY = _env_int("SONALITY_REFLECTION_EVERY", 20)
REFLECTION_SHIFT_THRESHOLD = 0.1

# --- engine internals named by the seed -------------------------------------------------
MAX_ESS_RETRIES = 2
MAX_RECENT_SHIFTS = 10
RESPONSE_MAX_TOKENS = 2048
MIN_EPISODE_RELEVANCE = 0.3
