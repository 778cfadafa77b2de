"""`sonality.config` as 002 describes it: constants, their defaults, their variables."""

from __future__ import annotations

from pathlib import Path

from tests.seed.seed_process import run_seed_code

READ_CONFIG = """
import json
from sonality import config
names = [
    "LOG_LEVEL", "ESS_THRESHOLD", "SPONGE_MAX_TOKENS", "EPISODE_RETRIEVAL_COUNT",
    "OPINION_BASE_RATE", "BELIEF_DECAY_RATE", "BOOTSTRAP_DAMPENING_UNTIL",
    "OPINION_COOLING_PERIOD", "SEMANTIC_RETRIEVAL_COUNT", "EPISODIC_RETRIEVAL_COUNT",
    "MAX_CONVERSATION_CHARS", "REFLECTION_EVERY", "REFLECTION_SHIFT_THRESHOLD",
    "MAX_ESS_RETRIES", "MAX_RECENT_SHIFTS", "MODEL", "ESS_MODEL", "ANTHROPIC_API_KEY",
]
paths = ["PROJECT_ROOT", "DATA_DIR", "SPONGE_FILE", "SPONGE_HISTORY_DIR", "CHROMADB_DIR"]
values = {name: getattr(config, name) for name in names}
values.update({name: str(getattr(config, name).resolve()) for name in paths})
print(json.dumps(values))
"""

#: 002's parameter table (and the constants 002/004 name elsewhere), unconfigured.
DOCUMENTED_DEFAULTS = {
    "LOG_LEVEL": "INFO",
    "ESS_THRESHOLD": 0.3,
    "SPONGE_MAX_TOKENS": 500,
    "EPISODE_RETRIEVAL_COUNT": 5,
    "OPINION_BASE_RATE": 0.1,
    "BELIEF_DECAY_RATE": 0.15,
    "BOOTSTRAP_DAMPENING_UNTIL": 10,
    "OPINION_COOLING_PERIOD": 3,
    "SEMANTIC_RETRIEVAL_COUNT": 2,
    "EPISODIC_RETRIEVAL_COUNT": 3,
    "MAX_CONVERSATION_CHARS": 100_000,
    "REFLECTION_EVERY": 20,
    "REFLECTION_SHIFT_THRESHOLD": 0.1,
    "MAX_ESS_RETRIES": 2,
    "MAX_RECENT_SHIFTS": 10,
}


def test_an_unconfigured_engine_has_the_documented_values(tmp_path: Path) -> None:
    got = run_seed_code(tmp_path, READ_CONFIG)
    assert {k: got[k] for k in DOCUMENTED_DEFAULTS} == DOCUMENTED_DEFAULTS
    assert got["MODEL"], "a model is chosen without configuration"
    assert got["ESS_MODEL"], "so is the model that rates evidence"
    assert got["ANTHROPIC_API_KEY"] == ""  # required to talk to the model, not to import
    # The state files sit under the data directory, named as 002 names them.
    data = Path(got["DATA_DIR"])
    assert Path(got["SPONGE_FILE"]) == data / "sponge.json"
    assert Path(got["SPONGE_HISTORY_DIR"]) == data / "sponge_history"
    assert Path(got["CHROMADB_DIR"]) == data / "chromadb"
    assert (Path(got["PROJECT_ROOT"]) / "sonality" / "config.py").is_file()


def test_the_documented_variables_set_the_values(tmp_path: Path) -> None:
    got = run_seed_code(
        tmp_path,
        READ_CONFIG,
        SONALITY_MODEL="model-a",
        SONALITY_ESS_MODEL="model-b",
        SONALITY_LOG_LEVEL="DEBUG",
        SONALITY_ESS_THRESHOLD="0.45",
        SONALITY_BOOTSTRAP_DAMPENING_UNTIL="4",
        SONALITY_OPINION_COOLING_PERIOD="1",
        SONALITY_SEMANTIC_RETRIEVAL_COUNT="4",
        SONALITY_EPISODIC_RETRIEVAL_COUNT="6",
        SONALITY_REFLECTION_EVERY="7",
        ANTHROPIC_API_KEY="sk-test",
    )
    assert got["MODEL"] == "model-a" and got["ESS_MODEL"] == "model-b"
    assert got["LOG_LEVEL"] == "DEBUG"
    assert got["ESS_THRESHOLD"] == 0.45
    assert got["BOOTSTRAP_DAMPENING_UNTIL"] == 4
    assert got["OPINION_COOLING_PERIOD"] == 1
    assert (got["SEMANTIC_RETRIEVAL_COUNT"], got["EPISODIC_RETRIEVAL_COUNT"]) == (4, 6)
    assert got["EPISODE_RETRIEVAL_COUNT"] == 10  # the two budgets together
    assert got["REFLECTION_EVERY"] == 7
    assert got["ANTHROPIC_API_KEY"] == "sk-test"


def test_the_env_file_is_read(tmp_path: Path) -> None:
    """002: configuration is loaded from `.env`."""
    (tmp_path / ".env").write_text("SONALITY_REFLECTION_EVERY=9\nSONALITY_ESS_THRESHOLD=0.2\n")
    got = run_seed_code(tmp_path, READ_CONFIG)
    assert (got["REFLECTION_EVERY"], got["ESS_THRESHOLD"]) == (9, 0.2)
