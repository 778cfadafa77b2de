"""Produce the example evaluation of docs/evaluation.md against the loopback stand-in.

    .venv/bin/python -m tests.evaluate.example principled /tmp/example
    cp /tmp/example/report.png docs/evaluation-example.png

Why it exists: the example in the docs was made with no real model reachable, by the
rule-based stand-ins the tests use; this is exactly how, so anyone can check it, redo
it after a change, or compare it with a run against a real model.
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
from pathlib import Path

from evaluate.command import run
from tests.evaluate.conftest import settings_for
from tests.evaluate.standins import Policy, StandIn
from tests.fakes.anthropic_fixtures import FAKE_API_KEY
from tests.fakes.anthropic_server import AnthropicFake


async def example(policy: Policy, out_dir: Path) -> int:
    async with AnthropicFake(api_key=FAKE_API_KEY) as server:
        server.brain = StandIn(policy=policy)
        with tempfile.TemporaryDirectory() as tmp:
            settings = settings_for(server, Path(tmp) / "data")
            label = f"loopback stand-in ({policy}), not a real model"
            argv = ["--yes", "--out", str(out_dir), "--label", label]
            return await run(argv, settings=settings)


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] not in ("principled", "pushover"):
        sys.exit("usage: .venv/bin/python -m tests.evaluate.example principled|pushover OUT_DIR")
    chosen: Policy = "principled" if sys.argv[1] == "principled" else "pushover"
    sys.exit(asyncio.run(example(chosen, Path(sys.argv[2]))))
