"""`sonality.config` reads, and `EngineConfig` checks, each tunable against the same
limits; the config is frozen, and one built from the environment is what code that
passes none gets."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from sonality import config
from sonality.config import EngineConfig
from tests.checkout import importing_this_checkout

TUNABLES = (
    "ESS_THRESHOLD",
    "BOOTSTRAP_DAMPENING_UNTIL",
    "OPINION_COOLING_PERIOD",
    "SEMANTIC_RETRIEVAL_COUNT",
    "EPISODIC_RETRIEVAL_COUNT",
    "REFLECTION_EVERY",
)
SCRIPT = (
    "import dataclasses, json\n"
    "from sonality import config\n"
    "from sonality.memory.updater import compute_magnitude\n"
    "from sonality.ess import safe_default_ess\n"
    "from sonality.state import SpongeState\n"
    f"constants = [getattr(config, n) for n in {TUNABLES!r}]\n"
    f"built = [getattr(config.ENVIRONMENT, n.lower()) for n in {TUNABLES!r}]\n"
    "assert constants == built, (constants, built)\n"
    # A seed-API call without a config follows the environment: a strong argument at
    # interaction 5 is halved only while 5 < BOOTSTRAP_DAMPENING_UNTIL.
    "ess = dataclasses.replace(safe_default_ess('x'), score=1.0, novelty=1.0)\n"
    "step = compute_magnitude(ess, SpongeState(interaction_count=5))\n"
    "assert step == (0.05 if 5 < config.BOOTSTRAP_DAMPENING_UNTIL else 0.1), step\n"
    "print(json.dumps(constants))\n"
)


def read_at_import(tmp_path: Path, values: dict[str, str]) -> list[float]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SONALITY_")}
    env.update({f"SONALITY_{name}": value for name, value in values.items()})
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT],
        cwd=tmp_path,  # no .env here
        env=importing_this_checkout(env),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    result: list[float] = json.loads(done.stdout)
    return result


def test_values_within_the_limits_are_read_and_others_fall_back(tmp_path: Path) -> None:
    defaults = read_at_import(tmp_path, {})
    assert defaults == [0.3, 10, 3, 2, 3, 20]
    edges = {"ESS_THRESHOLD": "1.0", "SEMANTIC_RETRIEVAL_COUNT": "50", "REFLECTION_EVERY": "1"}
    assert read_at_import(tmp_path, edges) == [1.0, 10, 3, 50, 3, 1]
    beyond = {
        "ESS_THRESHOLD": "1.5",
        "BOOTSTRAP_DAMPENING_UNTIL": "-1",
        "OPINION_COOLING_PERIOD": "x",
        "SEMANTIC_RETRIEVAL_COUNT": "51",
        "EPISODIC_RETRIEVAL_COUNT": "-1",
        "REFLECTION_EVERY": "0",
    }
    assert read_at_import(tmp_path, beyond) == defaults
    # Every value reading refuses, an EngineConfig refuses too (the text, as a number).
    for name, text in beyond.items():
        number: Any = text if text == "x" else (float if name == "ESS_THRESHOLD" else int)(text)
        with pytest.raises(ValidationError, match=name if text != "x" else "valid integer"):
            EngineConfig(**{name.lower(): number})
    assert read_at_import(tmp_path, {"BOOTSTRAP_DAMPENING_UNTIL": "3"})[1] == 3


@pytest.mark.parametrize(
    ("argument", "value", "message"),
    [
        ("ess_threshold", 1.5, "ESS_THRESHOLD must be between 0.0 and 1.0"),
        ("ess_threshold", -0.01, "ESS_THRESHOLD must be between 0.0 and 1.0"),
        ("ess_threshold", math.nan, "finite number"),
        ("semantic_retrieval_count", 51, "SEMANTIC_RETRIEVAL_COUNT must be between 0 and 50"),
        ("episodic_retrieval_count", -1, "EPISODIC_RETRIEVAL_COUNT must be between 0 and 50"),
        ("reflection_every", 0, "REFLECTION_EVERY must be between 1 and inf"),
        ("opinion_cooling_period", -1, "OPINION_COOLING_PERIOD must be between 0 and inf"),
        ("bootstrap_dampening_until", -1, "BOOTSTRAP_DAMPENING_UNTIL must be between 0 and inf"),
        # Strict: neither a setting's text nor a bool passes for a number.
        ("reflection_every", "20", "valid integer"),
        ("opinion_cooling_period", True, "valid integer"),
        ("ess_threshold", "0.3", "valid number"),
        # A misspelt tunable is an error, not silently the default.
        ("reflection_evry", 5, "Extra inputs are not permitted"),
    ],
)
def test_an_invalid_config_is_refused_at_construction(
    argument: str, value: Any, message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        EngineConfig(**{argument: value})


def test_the_edges_of_the_limits_are_accepted_and_the_defaults_are_the_seeds() -> None:
    edges = EngineConfig(
        ess_threshold=1.0,
        bootstrap_dampening_until=0,
        opinion_cooling_period=0,
        semantic_retrieval_count=50,
        episodic_retrieval_count=0,
        reflection_every=1,
    )
    assert (edges.ess_threshold, edges.semantic_retrieval_count, edges.reflection_every) == (
        1.0,
        50,
        1,
    )
    assert EngineConfig(ess_threshold=0).ess_threshold == 0.0  # an int is a number
    seed = EngineConfig()
    assert [getattr(seed, n.lower()) for n in TUNABLES] == [0.3, 10, 3, 2, 3, 20]
    assert (seed.model, seed.ess_model) == (config.DEFAULT_MODEL, config.DEFAULT_ESS_MODEL)


def test_the_episode_budget_is_derived_from_the_two_kinds() -> None:
    assert EngineConfig().episode_retrieval_count == 5
    budget = EngineConfig(semantic_retrieval_count=4, episodic_retrieval_count=6)
    assert budget.episode_retrieval_count == 10


def test_a_blank_model_keeps_the_default_and_a_named_one_is_trimmed() -> None:
    blank = EngineConfig(model="", ess_model="   ")
    assert (blank.model, blank.ess_model) == (config.DEFAULT_MODEL, config.DEFAULT_ESS_MODEL)
    named = EngineConfig(model=" gpt-4.1 ", ess_model="gpt-4.1-mini")
    assert (named.model, named.ess_model) == ("gpt-4.1", "gpt-4.1-mini")


def test_a_config_cannot_be_changed_once_built() -> None:
    given = EngineConfig(reflection_every=7)
    with pytest.raises(ValidationError, match="frozen"):
        given.reflection_every = 8
    assert given.reflection_every == 7
    assert not hasattr(config, "configure")  # nor rewritten through the module


def test_a_copy_with_changes_is_checked_like_a_new_config() -> None:
    given = EngineConfig(reflection_every=7)
    changed = given.model_copy(update={"ess_threshold": 0.5})
    assert (changed.ess_threshold, changed.reflection_every) == (0.5, 7)
    with pytest.raises(ValidationError, match="ESS_THRESHOLD must be between"):
        given.model_copy(update={"ess_threshold": 2.0})
    with pytest.raises(ValidationError, match="valid integer"):
        given.model_copy(update={"reflection_every": "20"})
    with pytest.raises(ValidationError, match="Extra inputs"):
        given.model_copy(update={"reflection_evry": 5})
    assert given.model_copy() == given


def test_code_passing_no_config_gets_the_environments() -> None:
    assert config.or_environment(None) is config.ENVIRONMENT
    given = EngineConfig()
    assert config.or_environment(given) is given
