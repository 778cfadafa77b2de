"""Quick-start command 2: lint, type-check and run the whole test suite.

Extra arguments go to pytest and skip the lint and type-check steps, so a subset runs
quickly (e.g. `python3 scripts/test.py tests/engine -x`).
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
    return subprocess.run([python, "-m", "pytest", *pytest_args]).returncode


if __name__ == "__main__":
    sys.exit(main())
