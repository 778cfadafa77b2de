"""Quick-start command 2: lint, type-check and run the whole test suite.

The whole suite is the main one, then the real-model tier (tests/real_model: the bot
against a 135M model on llama.cpp's server, a few minutes on 2 cores), which runs only
once the main suite passed. Extra arguments go to pytest and skip the lint and
type-check steps, so a subset runs quickly (e.g. `python3 scripts/test.py tests/engine
-x`); `python3 scripts/test.py -m real_model tests/real_model` runs the tier alone.
"""

from __future__ import annotations

import os
import subprocess
import sys

from _bootstrap import ROOT, ensure_venv


def main() -> int:
    python = str(ensure_venv(dev=True))  # pytest, ruff, mypy on top of the bot
    os.chdir(ROOT)
    pytest_args = sys.argv[1:]
    if not pytest_args:
        for step in (
            [python, "-m", "ruff", "check", "."],
            [python, "-m", "ruff", "format", "--check", "."],
            [python, "-m", "mypy"],
        ):
            print("$", " ".join(step[1:]), flush=True)
            if subprocess.run(step).returncode != 0:
                return 1
    code = subprocess.run([python, "-m", "pytest", *pytest_args]).returncode
    if pytest_args or code != 0:
        return code
    print("$ pytest -m real_model tests/real_model", flush=True)
    return subprocess.run(
        [python, "-m", "pytest", "-m", "real_model", "tests/real_model"]
    ).returncode


if __name__ == "__main__":
    sys.exit(main())
