"""The bot's process imports the OpenAI SDK and `onnx` only when it uses them.

Why: each stays resident for the life of the process (about 13 MB and 5 MB), and a bot
on Anthropic, with its embedding model already built, never calls either. Figure 4 of
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
    print(",".join(sorted(m for m in ("openai", "onnx") if m in sys.modules)))
import adapters.discord, adapters.slack, adapters.terminal
import app.__main__, app.preflight, app.wiring
import bot.runtime, bot.scheduler
import chroma_memory.embedding, sonality.memory.embedding
heavy()
import providers.openai  # what the OpenAI provider loads: the check must see it
heavy()
"""


def test_the_bot_imports_neither_the_openai_sdk_nor_onnx_until_it_needs_them() -> None:
    done = subprocess.run(
        [sys.executable, "-c", PROGRAM], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert done.stdout.splitlines() == ["", "openai"]
