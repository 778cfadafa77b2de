"""Child Python processes in the tests import this checkout, not the venv's install.

The shared venv's editable install points at whichever checkout installed it. A test
that starts `python -m app` (or any `python -c ...`) with a working directory outside
the repository would otherwise run that other checkout's code and pass or fail for the
wrong reason. PYTHONPATH is searched before the editable finder, so putting the repo
root first makes every child see the code under test.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def importing_this_checkout(env: Mapping[str, str]) -> dict[str, str]:
    """`env` with this repository first on PYTHONPATH (anything already there kept after)."""
    result = dict(env)
    rest = [p for p in result.get("PYTHONPATH", "").split(os.pathsep) if p and p != str(REPO)]
    result["PYTHONPATH"] = os.pathsep.join([str(REPO), *rest])
    return result
