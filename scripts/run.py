"""Quick-start command 1: run the bot (terminal community when no platform is configured).

It installs only what the bot needs (no test tools); arguments go to `python -m app`,
so `python3 scripts/run.py --help` lists the modes and settings.
"""

from __future__ import annotations

import os
import sys

from _bootstrap import ROOT, ensure_venv

if __name__ == "__main__":
    python = ensure_venv(dev=False)
    os.chdir(ROOT)
    os.execv(str(python), [str(python), "-m", "app", *sys.argv[1:]])
