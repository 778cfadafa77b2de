"""Run the benchmarks (see bench/catalog.py); extra arguments are passed on.

They run under the glibc settings the bot starts itself under, so they measure its cost.
"""

from __future__ import annotations

import os
import sys

from _bootstrap import ROOT, ensure_venv, scrubbed_environment

if __name__ == "__main__":
    python = ensure_venv()
    os.chdir(ROOT)
    environment = scrubbed_environment(python)
    os.execve(str(python), [str(python), "-m", "bench", *sys.argv[1:]], environment)
