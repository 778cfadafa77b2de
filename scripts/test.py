"""Quick-start command 2: lint, type-check and run the whole test suite.

The whole suite is the main one, then the real-model tier (tests/real_model: the bot
against a 135M model on llama.cpp's server, a few minutes on 2 cores), which runs only
once the main suite passed. The main suite runs in pytest-xdist workers, one per core
(at least two, at most four): most of its time is bot processes starting and servers
answering, so a second worker takes it from about 12 to under 7 minutes on 2 cores.
The real-model tier stays in one process, as its model server is shared by its tests.
Both run under the glibc settings the bot starts itself under (freed memory scrubbed,
sonality/memory/freed_memory.py), as the tests run the bot in their own processes.

Extra arguments go to pytest (in one process; add `-n 2` for workers) and skip the lint
and type-check steps, so a subset runs quickly (e.g. `python3 scripts/test.py
tests/engine -x`); `python3 scripts/test.py -m real_model tests/real_model` runs the
tier alone.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from _bootstrap import ROOT, ensure_venv, scrubbed_environment


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
    env = scrubbed_environment(Path(python))
    # The whole suite names its 15 slowest tests, so what makes it slow shows in every run.
    workers = (
        []
        if pytest_args
        else ["-n", str(main_suite_workers()), "--dist", "loadfile", "--durations=15"]
    )
    code = subprocess.run([python, "-m", "pytest", *workers, *pytest_args], env=env).returncode
    if pytest_args or code != 0:
        return code
    print("$ pytest -m real_model tests/real_model", flush=True)
    return subprocess.run(
        [python, "-m", "pytest", "-m", "real_model", "tests/real_model"], env=env
    ).returncode


def main_suite_workers() -> int:
    """One worker per core this process may use, within 2..4 (each worker starts its own
    PostgreSQL and Chroma servers when its tests need them)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return max(2, min(4, cores or 2))


if __name__ == "__main__":
    sys.exit(main())
