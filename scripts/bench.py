"""Run the benchmarks (see bench/catalog.py); extra arguments are passed on."""

from __future__ import annotations

import os
import sys

from _bootstrap import ROOT, ensure_venv

if __name__ == "__main__":
    python = ensure_venv()
    os.chdir(ROOT)
    os.execv(str(python), [str(python), "-m", "bench", *sys.argv[1:]])
