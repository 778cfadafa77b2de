"""The engine's `config.DATA_DIR` and the bot's `SONALITY_DATA_DIR` name one place."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.checkout import importing_this_checkout

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = (
    "import json\n"
    "from sonality import config\n"
    "from bot.settings import Settings\n"
    "print(json.dumps([str(config.DATA_DIR.resolve()), "
    "str(Settings(_env_file=None).data_dir.resolve())]))\n"
)


@pytest.mark.parametrize("configured", [None, "elsewhere/data"])
def test_engine_and_bot_agree_where_data_lives(tmp_path: Path, configured: str | None) -> None:
    env = {k: v for k, v in os.environ.items() if k != "SONALITY_DATA_DIR"}
    if configured is not None:
        env["SONALITY_DATA_DIR"] = configured
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT],
        cwd=tmp_path,  # no .env here, and a working directory that is not the project's
        env=importing_this_checkout(env),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    engine, bot = json.loads(done.stdout)
    assert engine == bot == str(tmp_path / (configured or "data"))
