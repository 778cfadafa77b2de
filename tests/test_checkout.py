"""Child processes started by the tests run this checkout's code (tests/checkout.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.checkout import REPO, importing_this_checkout
from tests.integration.test_process import bot_env


def test_a_child_outside_the_repo_imports_this_checkout(tmp_path: Path) -> None:
    env = importing_this_checkout({**os.environ, "PYTHONPATH": "/somewhere/else"})
    assert env["PYTHONPATH"].split(os.pathsep) == [str(REPO), "/somewhere/else"]
    done = subprocess.run(
        [sys.executable, "-c", "import bot, storage; print(bot.__file__); print(storage.__file__)"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    for line in done.stdout.splitlines():
        assert Path(line).resolve().is_relative_to(REPO), line


def test_the_bot_process_environment_puts_this_checkout_first(tmp_path: Path) -> None:
    assert bot_env(tmp_path)["PYTHONPATH"].split(os.pathsep)[0] == str(REPO)
