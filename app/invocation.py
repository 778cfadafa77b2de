"""How a person starts this program, for the commands it prints (`--help`, hints).

Why not always `python -m app`: in a checkout nothing activates `.venv`, so that form
fails with `ModuleNotFoundError` for the first dependency; `scripts/run.py` creates the
environment and hands its arguments to `python -m app`. An installed copy (the
container image, `pip install .`) has no `scripts/` folder, and there the module form
is the one that works.
"""

from __future__ import annotations

from pathlib import Path

#: The quick-start script of a checkout, next to the `bot` package.
CHECKOUT_RUNNER = Path(__file__).resolve().parent.parent / "scripts" / "run.py"


def program() -> str:
    """The command that runs the bot here, as a person would type it."""
    return "python3 scripts/run.py" if CHECKOUT_RUNNER.is_file() else "python -m app"
