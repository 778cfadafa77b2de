"""The bot's process imports the OpenAI SDK, `onnx` and `cryptography` only when it uses them.

Why: each stays resident for the life of the process (about 13, 5 and 7 MB), and a bot
on Anthropic, with its embedding model already built and no encrypted Slack
installations, never calls any of them. Figure 4 of
the benchmarks counts them.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

PROGRAM = """
import sys
def heavy():
    print(",".join(sorted(m for m in ("cryptography", "openai", "onnx") if m in sys.modules)))
import adapters.discord, adapters.slack, adapters.terminal
import app.__main__, app.preflight, app.wiring
import bot.runtime, bot.scheduler
import chroma_memory.embedding, sonality.memory.embedding
heavy()
import providers.openai  # what the OpenAI provider loads: the check must see it
heavy()
from storage.platform import make_cipher
make_cipher("A" * 43 + "=")  # a secret key for Slack installations brings in cryptography
heavy()
"""


def test_the_bot_imports_no_openai_sdk_onnx_or_cryptography_until_it_needs_them() -> None:
    done = subprocess.run(
        [sys.executable, "-c", PROGRAM], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert done.stdout.splitlines() == ["", "openai", "cryptography,openai"]
