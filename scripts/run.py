"""Quick-start command 1: run the bot (terminal community when no platform is configured)."""

from __future__ import annotations

import os
import sys

from _bootstrap import ROOT, ensure_venv

if __name__ == "__main__":
    python = ensure_venv()
    os.chdir(ROOT)
    os.execv(str(python), [str(python), "-m", "bot", *sys.argv[1:]])
