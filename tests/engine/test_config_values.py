"""`sonality.config` reads and `configure` checks each tunable against the same limits."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from sonality import config
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
    "import json\n"
    "from sonality import config\n"
    f"print(json.dumps([getattr(config, n) for n in {TUNABLES!r}]))\n"
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


@pytest.mark.parametrize(
    ("argument", "value", "message"),
    [
        ("ess_threshold", 1.5, "ESS_THRESHOLD must be between 0.0 and 1.0"),
        ("semantic_retrieval_count", 51, "SEMANTIC_RETRIEVAL_COUNT must be between 0 and 50"),
        ("reflection_every", 0, "REFLECTION_EVERY must be between 1 and inf"),
    ],
)
def test_configure_refuses_what_reading_would_refuse(
    argument: str, value: float, message: str
) -> None:
    """A refused value leaves every value as it was, a valid one passed with it too."""
    before = config.OPINION_COOLING_PERIOD, getattr(config, argument.upper())
    with pytest.raises(ValueError, match=message):
        arguments: dict[str, Any] = {argument: value}
        config.configure(opinion_cooling_period=before[0] + 1, **arguments)
    assert (config.OPINION_COOLING_PERIOD, getattr(config, argument.upper())) == before
